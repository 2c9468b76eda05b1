"""Entry scripts for training, and the tiny offline model."""
