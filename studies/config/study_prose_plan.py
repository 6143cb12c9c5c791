# studies/study.py's plan for the second corpus (docs/study.md, Second corpus); not a train.py config:
#   python studies/study.py studies/config/study_prose_plan.py                # trains what assets/study_prose/ lacks
#   python studies/study.py studies/config/study_prose_plan.py --train=False  # summary and figures from the records
base = 'studies/config/study_prose.py'
arms = 'original,pairwise,original_scaled,original_heat'
seeds = '2,3,4,5,6'
min_steps = 3000  # every prose run goes to the cap: its losses at step 1,000 and at the cap are observed for all
out_dir = 'out/study_prose'
records = 'assets/study_prose'
summary = 'assets/study_prose.json'
figures = 'assets/study_prose'
