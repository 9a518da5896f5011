#!/bin/bash
# A verifier with a bug: it checks the work but never writes reward.txt or
# reward.json, so Harbor reports RewardFileNotFoundError. trialbus must record
# these trials as unscored (a verifier failure), never as zeros.
test -d /app/output && echo "output folder present"
exit 0
