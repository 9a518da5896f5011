#!/bin/bash
set -euo pipefail
cd /app
echo alpha > a.txt
echo beta > b.txt
echo gamma > c.txt
