"""Moved: the studies live in studies/ (docs/study.md). This stub only names the new command."""
raise SystemExit("study.py moved: run `python studies/study.py` (same settings; its configs are in studies/config/)")
