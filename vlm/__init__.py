"""The vision-language models as the code meets them: the supported families and what differs between them
(families), how many tokens a prompt takes through a family's processor, images included (prompt_tokens), and the
one client of OpenAI-compatible chat endpoints, for generation, judges and the data generator (chat_client).
Imports only cli."""
