"""`python -m pergrad.train [Hydra overrides]`: the training entry (see pergrad/train/cli.py)."""
from pergrad.train.cli import main

if __name__ == "__main__":
  main()
