// The ledger's own user, made once: the mongo image runs this (mounted into
// /docker-entrypoint-initdb.d by compose.yaml) on an empty volume, as the root user,
// before the replica set starts. readWrite on the ledger database only: the services
// never get the root password. The password file is a compose secret written by
// `trialbus compose-config` (mongo/ledger-password), copied to /run/trialbus by the
// container's entrypoint; nothing secret is in this file.
const fs = require("fs");
const ledgerDb = process.env.TRIALBUS_LEDGER_DB || "trialbus";
const password = fs.readFileSync("/run/trialbus/ledger-password", "utf8").trim();
db.getSiblingDB(ledgerDb).createUser({
  user: "trialbus",
  pwd: password,
  roles: [{ role: "readWrite", db: ledgerDb }],
});
