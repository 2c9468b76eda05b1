"""From released files to training and evaluation datasets."""
