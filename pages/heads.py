"""Heads: a card for every head of a model over many sentences, searchable, each context one click from Explore.

The cards are ``mha_core.head_cards`` through ``ui.heads_page`` (settings and logic: ``ui.page_heads``)."""

from ui import heads_page, shell

shell.in_app()  # a page's own address opened on a new server: run it inside app.py

heads_page.show()
