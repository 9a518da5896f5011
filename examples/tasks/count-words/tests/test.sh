#!/bin/bash
# Reward 1 when /app/count.txt holds 9 (the word count of the given sentence), else 0.
if [ "$(tr -d '[:space:]' < /app/count.txt 2>/dev/null)" = "9" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
