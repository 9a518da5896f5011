#!/bin/bash
# Writes reward.json with several keys: "reward" (fraction of files right, the main
# key) plus one 0/1 key per file.
cd /app 2>/dev/null || true
check() { [ "$(cat "$1" 2>/dev/null)" = "$2" ] && echo 1 || echo 0; }
a=$(check a.txt alpha); b=$(check b.txt beta); c=$(check c.txt gamma)
python3 - "$a" "$b" "$c" <<'PY'
import json, sys
a, b, c = (int(x) for x in sys.argv[1:])
json.dump({"reward": (a + b + c) / 3, "file_a": a, "file_b": b, "file_c": c},
          open("/logs/verifier/reward.json", "w"))
PY
