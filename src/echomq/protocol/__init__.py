"""The protocol, sans-I/O: Lua scripts loaded, each verb as a Call or a Plan, keys and records.

Internal: nothing here is API. The API is the names ``echomq`` exports and the public modules
at the top of the package (docs/API.md); these modules move and change without notice.
"""
