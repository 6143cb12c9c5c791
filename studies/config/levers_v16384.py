# The levers' pilot, the smaller vocabulary (docs/study_levers.md): studies/config/levers.py with GPT-2's first
# 16,384 ids (prepare_oscar.py --vocab_size=16384), everything else the same:
#     python studies/study_small.py studies/config/levers.py studies/config/levers_v16384.py --glue_dir=<GLUE> --hours=2.5 \
#         --glue_args='--max_train_samples=10000 --dtype=float32'
# --glue_args on the command line, not here: a call runs the configs of its clone (eed7277), and fine-tunes in
# float32 as at 50,304 ids, where the plan's "dtype auto: float32 here" held on the 2-core AMD EPYC; on a CPU with
# native bf16, auto takes bf16 (docs/study_levers.md, the amendment of 2026-12-03). The rebuild takes it too.
commit = 'eed7277'  # the 50,304-id cells' (their records'): the code of both vocabularies' runs the same
data_dir = 'data/english-v16384'  # python prepare_oscar.py --source=english --vocab_size=16384 --out_dir=data/english-v16384
corpora = 'data/english-v16384-glue-0.5'  # ... --vocab_size=16384 --mix=glue --mix_share=0.5 --glue_dir=<GLUE> --out_dir=<it>
out_dir = 'out/levers_v16384'
records = 'assets/levers/v16384'
summary = 'assets/levers_v16384.json'
figures = 'assets/levers_v16384'
