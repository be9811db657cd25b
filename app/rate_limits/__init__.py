"""Rate limits per (company, user) and per company on the costly routes, enforced per process
with a share of each limit, plus the operators' per-company overrides."""
