"""Event subjects and their owners: what each app may bind (``subjects``) and the admin's grants (``grants``)."""
