"""Probe 103's driver: ``gpu_probe103.py`` for two trees, alternating in fresh processes, ROUNDS
rounds (default 2); then the median of each measurement per tree.

    python3 gpu_ab103.py NEW_TREE OLD_TREE OUT.csv
"""
import os
import subprocess
import sys

import pandas as pd

new, old, out_csv = sys.argv[1:4]
probe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_probe103.py")
for round_ in range(int(os.environ.get("ROUNDS", 2))):
    for tree, label in ((new, "new"), (old, "old")) if round_ % 2 == 0 else ((old, "old"), (new, "new")):
        subprocess.run([sys.executable, probe, tree, label, out_csv], check=True)
frame = pd.read_csv(out_csv)
table = frame.groupby(["part", "name", "tree"])["value"].median().unstack("tree")
table["new / old"] = table["new"] / table["old"]
print(table.to_string(float_format=lambda v: f"{v:.3f}"))
