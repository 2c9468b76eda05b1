"""How every command reads its input and ends: the argument parser and the one wrapper around each `main`
(entry), the one bad-input error (errors), numbers checked where they are parsed (numbers), the strict YAML
reader (strict_yaml), data paths kept inside their folder (paths), keys from the environment only and redacted
everywhere (secrets), and our loggers (log). The ground floor: it imports nothing of this project."""
