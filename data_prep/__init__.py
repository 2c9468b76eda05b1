"""From released files to training and evaluation datasets: SPY's shared rules (spy), the category file
(categories), SPY-Tune (spy_tune) and SPY-Bench (spy_bench), the offline synthetic data (synthetic) and the data
generator (generate, with what it asks a VLM and how it reads the replies in generate_prompts). Imports cli, store
and vlm."""
