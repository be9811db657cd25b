"""Who the caller is: `GET /v1/me`, the user, company and roles the bearer token names."""
