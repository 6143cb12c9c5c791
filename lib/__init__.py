"""What the scripts at the top of the repository import; nothing here is run on its own. Importing the package
loads nothing (train.py imports lib.interrupt before torch)."""
