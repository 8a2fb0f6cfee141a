#!/usr/bin/env python
"""Train a model: `python scripts/train.py [Hydra overrides]` (see pergrad/train/cli.py).

    python scripts/train.py experiment=quickstart
    python scripts/train.py model=tiny train.steps=200 optimizer.lr=3e-3 logging.wandb.mode=disabled
    python scripts/train.py -m optimizer.lr=1e-3,3e-3 data.batch_size=16,32
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout too

from pergrad.train.cli import main  # noqa: E402

if __name__ == "__main__":
  main()
