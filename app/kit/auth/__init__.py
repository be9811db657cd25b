"""Bearer-token authentication, the only importer of PyJWT: a token verified into a `Principal`
(`verify`), the active verifiers as start-up logs them (`verifiers`), a token signed for the
`token` command and the tests (`mint`), all three free of the web framework; and the FastAPI
dependencies over them, the caller of a request and its role checks (`dependencies`).
"""
