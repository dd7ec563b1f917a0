"""Many sentences at once: profiling every head over a corpus, in shards that are cached and resumed.

``profile(model, sentences)`` returns the mean of ``head_metrics`` over the sentences and, when the
sentences carry dependency trees, the Clark et al. dependency accuracy of every head
(``syntax.dependency_scores``). It works in four steps, each usable alone (a distributed executor
runs ``compute_shard`` elsewhere and merges the parts the same way):

    plan_shards     the corpus cut into consecutive shards of ``shard_size`` sentences; the cut depends
                    on the sentences and the shard size only
    compute_shard   one shard measured, as a function of the model and the shard alone: padded batches
                    of similar lengths, each measured at once -> a ``ProfilePart`` (per-head sums and
                    counts, label tallies, dependency counts: small, mergeable, no model inside)
    merge_parts     parts added up in corpus order, whatever order they were computed in
    finish_profile  the merged part as a ``ProfileResult``

Cache, in ``$HEADSCOPE_CACHE_DIR/profiles`` (default ``~/.cache/headscope/profiles``), every file
written atomically (a temporary file, then one rename):

    shards/<settings key>/<shard digest>.npz   one finished shard (``ShardCache``): arrays and a JSON header
    results/<result key>/                      the finished profile (metrics.parquet, dependency.parquet, meta.json)

The settings key hashes the model name, a fingerprint of its weights and config, the source of the code
that computes the numbers, the batch size and the shard size; the shard digest hashes the shard's
sentences and trees; the result key hashes the settings key and every shard digest. A profile that is
stopped (a progress callback that raises, Ctrl-C, a killed process) keeps its finished shards, and the
same call resumes from them. Finished results are also kept in memory, the few most recently used.

Modules: ``reading`` (corpora read lazily), ``shards`` (the cut, the shard cache), ``parts`` (mergeable partial
results), ``measure`` (``compute_shard``), ``profiling`` (``profile``), ``ray_executor`` (the Ray executor),
``storage`` (files written atomically, cache keys), ``coreference``, ``tables`` (the per-head table, files).

``coreference.coreference_scores(model)`` scores every head on the hand-made pronoun -> antecedent set in
``assets/coreference.jsonl``.
"""
