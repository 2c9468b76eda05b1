"""SPY-Bench: samples, prompts, judge prompt, metrics, self-moderation."""
