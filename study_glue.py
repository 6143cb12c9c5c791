"""Moved: the studies live in studies/ (docs/study_glue.md). This stub only names the new command."""
raise SystemExit("study_glue.py moved: run `python studies/study_glue.py` (same settings; its configs are in studies/config/)")
