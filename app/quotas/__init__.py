"""Quotas per user and per company: the rules (`rule.py`), the marks a periodic check writes for
whoever is over a stored-amount quota (`models.py`, `repository.py`) and that check as a worker
housekeeping step (`maintenance.py`)."""
