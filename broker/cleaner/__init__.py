"""The log cleaner (`cleanup.policy=compact`), built the way Kafka's LogCleaner works (issue 21).

Pure parts, no I/O and no asyncio:
  * offset_map.py: `OffsetMap`, the fixed-size key hash -> last offset table (Kafka's
    SkimpyOffsetMap) built over the dirty part of a log in bounded memory;
  * selection.py: which log to clean and what range (Kafka's LogCleanerManager), how segments are
    grouped for rewriting and which records and batches a rewrite keeps (Kafka's Cleaner).

With file I/O:
  * cleaner.py: `Cleaner`, one cleaning round of one log on a cleaner thread (map, rewrite into
    `.cleaned` files, swap on the event loop), applying the rules of the two modules above; the
    `.cleaned` / `.swap` file steps and their completion at load are broker/storage/segment_swap.py.
"""
