"""Store: where jobs, template snapshots and trials live. This package owns the storage contract
(`base.Store`: a small documented interface whose queries filter in the store, not in the
caller) and `open_store(url)`, which finds the implementation through the `porter.plugins` entry
point; the SQL implementation lives in db/, so imports run one way (db -> porter)."""
