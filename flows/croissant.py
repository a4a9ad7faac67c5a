"""A release's machine-readable metadata: the Hugging Face `dataset_info` of its card and its
Croissant JSON-LD (every file with its sha256, a record set per config and split)."""
from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from flows.versions import ReleaseError

# What Croissant's `citeAs` asks for: the publication that describes the dataset, in BibTeX.
CITATION = """@misc{liu2026steptp,
  title = {Step-TP: A Grounded, Step-Level Dataset with Chain-of-Thought Reasoning for LLM-Guided Tensor Program
           Optimization},
  author = {Liu and Zheng and Su and Wu},
  year = {2026},
  note = {Rebuilt with the Step-TP data lake toolchain}
}"""
# Croissant's Responsible-AI fields (`rai:`), true of every release this pipeline builds.
RESPONSIBLE_AI = {
    "data_collection": "Generated, not collected: PyTorch modules of a workload catalogue, traced to LEIR at shapes "
                       "drawn under a work budget, rewritten by 43 rule-based strategies, verified with TVM against "
                       "the original program on seeded input draws; chains of thought rendered from each "
                       "transformation record by templates over a static analysis; runtimes measured with TVM on one "
                       "CPU named in the card.",
    "data_collection_type": ["Synthetic"],
    "data_limitations": "Verified on seeded inputs, not proved equivalent. Runtimes and effect classes are "
                        "measurements of one machine: another CPU may rank the same steps differently, and steps "
                        "of programs written for a GPU are not timed. Shapes are smaller than production layers. "
                        "Chains of thought are template text over static figures that can disagree with the clock "
                        "(the card gives the rate).",
    "data_biases": "The mix of strategies follows the catalogue's workloads and the filter's caps, not how often a "
                   "compiler would use each; the test split holds out families chosen for strategy coverage, not "
                   "at random; half-precision programs are few.",
    "personal_sensitive_information": "None: the records are generated tensor programs and text about them.",
    "data_use_cases": "Supervised fine-tuning (default, chat, sft), preference tuning (preference, "
                      "preference_chat), process supervision and search research (measured, trajectories) of models "
                      "that optimise tensor programs; evaluation on the held-out test split. Not a benchmark of "
                      "hardware speed, nor a source of production schedules without verification on the target.",
}


def _features(schema: pa.Schema) -> list[dict]:
    """Hugging Face `dataset_info.features` of an Arrow schema (the types a release uses)."""
    return [{"name": f.name, **_feature_type(f.type)} for f in schema]


def _feature_type(t: pa.DataType) -> dict:
    if pa.types.is_list(t):
        inner = t.value_type
        if pa.types.is_struct(inner):
            return {"list": [{"name": f.name, **_feature_type(f.type)} for f in inner]}
        return {"list": _feature_type(inner)["dtype"]}
    names = {pa.string(): "string", pa.large_string(): "large_string", pa.int64(): "int64", pa.int32(): "int32",
             pa.float64(): "float64", pa.float32(): "float32", pa.bool_(): "bool"}
    if t not in names:
        raise ReleaseError(f"no Hugging Face feature type for Arrow type {t}")
    return {"dtype": names[t]}


def dataset_info(folder: Path, tables: dict[str, dict[str, pa.Table]]) -> list[dict]:
    """`dataset_info` of the card, one entry per config: features, and per split the examples and the
    bytes of the Arrow data (`num_bytes`); the Parquet bytes to download and the Arrow bytes in all."""
    out = []
    for config, splits in tables.items():
        folder_name = "data" if config == "default" else config
        schema = next(iter(splits.values())).schema
        # the Arrow bytes of each split as a reader gets it back from its Parquet file (what `datasets`
        # counts; a table built in memory may be laid out a few bytes differently)
        read = {s: pq.read_table(folder / folder_name / f"{s}.parquet") for s in splits}
        entries = [{"name": s, "num_bytes": t.nbytes, "num_examples": t.num_rows} for s, t in read.items()]
        download = sum((folder / folder_name / f"{s}.parquet").stat().st_size for s in splits)
        out.append({"config_name": config, "features": _features(schema), "splits": entries,
                    "download_size": download, "dataset_size": sum(e["num_bytes"] for e in entries)})
    return out


def write_croissant(folder: Path, version: str, params, tables: dict, date: str) -> None:
    """Croissant metadata built with mlcroissant: every file as a FileObject (relative contentUrl,
    sha256), a record set per config and split over its Parquet file, `datePublished` the release date."""
    import mlcroissant as mlc

    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    formats = {".parquet": "application/x-parquet", ".jsonl": "application/jsonlines", ".md": "text/markdown",
               ".png": "image/png", ".json": "application/json"}
    distribution = [mlc.FileObject(id=f, name=f, content_url=f, encoding_formats=[formats[Path(f).suffix]],
                                   sha256=hashlib.sha256((folder / f).read_bytes()).hexdigest()) for f in files]
    record_sets = []
    for config, splits in tables.items():
        if any(pa.types.is_list(f.type) and pa.types.is_struct(f.type.value_type)
               for f in next(iter(splits.values())).schema):
            continue  # nested messages (`chat`, `sft`, `preference_chat`): their files are listed above
        folder_name = "data" if config == "default" else config
        for split, table in splits.items():
            set_id = split if config == "default" else f"{config}_{split}"
            fields = [mlc.Field(id=f"{set_id}/{f.name}", name=f.name, data_types=[_croissant_type(f.type)],
                                repeated=True if pa.types.is_list(f.type) else None,
                                source=mlc.Source(file_object=f"{folder_name}/{split}.parquet",
                                                  extract=mlc.Extract(column=f.name)))
                      for f in table.schema]
            record_sets.append(mlc.RecordSet(id=set_id, name=set_id, fields=fields))
    rel = params.release
    creator = rel.get("creator") or {"name": "Step-TP data lake maintainers"}
    metadata = mlc.Metadata(
        name=f"step-tp-v{version}", version=version, license=[rel["license"]],
        description="Step-level verified LEIR tensor-program transformations with chain of thought.",
        creators=[mlc.Organization(name=creator["name"], url=creator.get("url"))],
        url=rel.get("url"), cite_as=rel.get("cite_as") or CITATION,
        date_published=datetime.datetime.fromisoformat(date), distribution=distribution, record_sets=record_sets,
        **RESPONSIBLE_AI)
    (folder / "croissant.json").write_text(json.dumps(metadata.to_json(), indent=1, sort_keys=True, default=str)
                                           + "\n")


def _croissant_type(t: pa.DataType):
    import mlcroissant as mlc

    t = t.value_type if pa.types.is_list(t) else t
    if pa.types.is_integer(t):
        return mlc.DataType.INTEGER
    if pa.types.is_floating(t):
        return mlc.DataType.FLOAT
    if pa.types.is_boolean(t):
        return mlc.DataType.BOOL
    return mlc.DataType.TEXT
