"""The control plane: companies listed and read with a summary each, created, offboarded (a
durable job with a receipt), their users erased on request, and their spaces set, by platform
operators and by each company's own operators."""
