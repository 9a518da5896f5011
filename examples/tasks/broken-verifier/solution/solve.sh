#!/bin/bash
set -euo pipefail
mkdir -p /app/output
