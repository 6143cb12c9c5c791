"""What the scripts at the top of the repository import; nothing here is run on its own. Importing the package
loads nothing (every script imports lib.interrupt first, before torch)."""
