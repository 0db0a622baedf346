"""Galleries: what ``smso-embed`` wrote, searchable by nearest neighbour beside the model.

* :mod:`gallery.codes`: the stored codes (f32, f16, i8, b1) of the standardised embeddings,
  and their similarity;
* :mod:`gallery.stamp`: the model a gallery belongs to, and the check that refuses any other;
* :mod:`gallery.store`: the folder on disk, its manifest and checked arrays;
* :mod:`gallery.search`: a loaded gallery and its k-nearest search (usearch: HNSW or exact);
* :mod:`gallery.build`: a first build, and the in-place update after a resumed job.

numpy, usearch and the model card only: the service loads galleries (no pyarrow, no Ray), and
``smso-index`` (:mod:`batch.index_cli`) builds them from smso-embed's Parquet.
"""
