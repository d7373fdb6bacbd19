"""The mhaspec conformance suite: one test module per spec chapter, run by the pytest plugin.

Run it with ``pytest --pyargs mhaspec.conformance [--backend NAME|module:attr]``.
"""
