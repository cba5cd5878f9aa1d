"""Side-by-side benchmark of shardetcd against a real etcd (``python -m bench``).

See bench/README.md for what is measured and how to read the report.
"""
