"""The caller's memory over the Model Context Protocol: tools and a resource on the same services
as `/v1/me/*`, served at `/mcp` (Streamable HTTP) behind the same bearer token."""
