"""
The studies of the implementation, apart from it: each is a script that runs its plan as train.py and
finetune_glue.py jobs from the repository root, keeps every finished job's small record under assets/, and rebuilds
its summary and figures from those records alone (--train=False).

    study.py       the plateau study (docs/study.md): when does each operator leave the initial loss plateau?
    study_glue.py  the second study (docs/study_glue.md): the paper's GLUE table and HybridBERT's claims, laptop scale
    study_small.py the third study (docs/study_small.md): the paper's bert-small on one GPU, trained until
                   pre-training pays on GLUE; its GPU runner, one device call per run
    jobs.py        what they share: the jobs, a few at a time, and the records they leave
    carry.py       what study_small.py carries to the GPU machine (corpus, GLUE, BPE files) and brings back
    small_report.py study_small.py's summary as Markdown tables and a figure
    stats.py       their small-n statistics (Kaplan-Meier, paired t, exact sign-flip, Holm, TOST)
    config/        their train.py configs and plans
"""
