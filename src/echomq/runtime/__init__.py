"""The runtime: what the worker runs (queue loops, runner, pools, supervisor).

Internal: nothing here is API. The API is the names ``echomq`` exports and the public modules
at the top of the package (docs/API.md); these modules move and change without notice.
"""
