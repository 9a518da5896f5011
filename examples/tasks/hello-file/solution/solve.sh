#!/bin/bash
set -euo pipefail
echo "Hello, world!" > /app/hello.txt
