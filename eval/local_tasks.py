"""lm-eval task managers that index only a folder of local tasks when it holds every task asked for: lm-eval's
TaskManager otherwise indexes its ~14,000 built-in task YAML files as well, ~10 s each time one is made."""

from __future__ import annotations


def task_found(index: dict, name: str, seen: frozenset = frozenset()) -> bool:
    """Whether ``name`` is in a TaskManager's ``index`` with every task it names: a group's listed tasks
    (recursively; inline task configs count as found)."""
    entry = index.get(name)
    if entry is None:
        return False
    members = (entry.cfg or {}).get("task") if getattr(entry.kind, "name", "") == "GROUP" else None
    if not isinstance(members, list):
        return True
    return all(not isinstance(m, str) or (m not in seen and task_found(index, m, seen | {name})) for m in members)


def local_task_manager(tasks: list[str], include_path: str | None, metadata: dict | None = None):
    """lm-eval's TaskManager over ``include_path`` alone when it holds every task of ``tasks`` (and every task a
    group of them lists), else None."""
    from lm_eval.tasks import TaskManager

    if not include_path:
        return None
    local = TaskManager(include_path=include_path, include_defaults=False, metadata=metadata)
    return local if all(task_found(local.task_index, t) for t in tasks) else None


def task_manager(tasks: list[str], include_path: str | None, metadata: dict | None = None):
    """lm-eval's TaskManager for ``tasks``: :func:`local_task_manager`'s when there is one, else over include_path
    and lm-eval's built-in tasks. Indexing the ~14,000 built-in task YAML files takes ~10 s per TaskManager; a suite
    of local tasks does not need them."""
    from lm_eval.tasks import TaskManager

    local = local_task_manager(tasks, include_path, metadata)
    return local if local is not None else TaskManager(include_path=include_path, metadata=metadata)
