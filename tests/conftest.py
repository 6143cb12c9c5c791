import os
import sys

import torch

# the project is a set of top-level scripts (nanoGPT style): make them importable from the tests
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(min(2, torch.get_num_threads()))
