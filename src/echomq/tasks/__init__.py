"""The application's objects: Task, argument binding, workflows, batches.

Internal: nothing here is API. The API is the names ``echomq`` exports and the public modules
at the top of the package (docs/API.md); these modules move and change without notice.
"""
