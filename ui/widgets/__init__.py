"""Streamlit controls shared by the pages, one module per kind: ``sidebar``, ``pickers`` (layer, head and
settings kept in the URL), ``messages``, ``charts``, ``downloads`` and ``views``. A page imports the modules
it uses."""
