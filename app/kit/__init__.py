"""The service's shared plumbing, which knows no domain: configuration, errors, the database
and the hot path's driver pool, authentication and the issuers' keys, token counting, the
language-model adapter, request limits, the HTTP protocol, pagination, logs, metrics and traces,
the lean routes, the embedded PostgreSQL, the published contract's additions, the API's tags,
snapshots and the spooled responses sent from them. It imports nothing else of `app`."""
