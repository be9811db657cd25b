"""The database, free of the web framework (the worker runs on it alone): the declarative base
(`base`), the engine and its pools (`engine`), the hot path's driver connections
(`driver_pool`), which failures mean the database is unavailable (`errors`), the readiness
check (`readiness`) and the migrations (`migrations`). A request's transaction (`SessionDep`)
is in `app/kit/deps.py`.
"""
