#!/bin/bash
set -euo pipefail
cd /app
[ -f input.txt ] || echo "the quick brown fox jumps over the lazy dog" > input.txt
wc -w < input.txt | tr -d ' ' > count.txt
