# A session's interpreter state: its globals pickled into a memfd the
# kernel sent (a snapshot with `state`), and loaded into a fresh
# interpreter from a descriptor of a snapshot's (after a restore, into a
# branch). Pickled and unpickled only here, inside the sandbox: the kernel
# keeps the bytes and never reads them. A module is kept by its name and
# imported again; every name that cannot be saved or loaded is named, with
# why, never dropped silently. (pickle and importlib are imported when a
# snapshot or restore comes, not by the zygote.)

import os


def save_state(scope, fd):
    """Pickles each global of ``scope`` into ``fd``, one by one: what one
    cannot pickle is named in ``left_out``."""
    import pickle
    import types

    modules, values, not_saved = {}, {}, []
    for name, value in list(scope.items()):
        if name.startswith("__") and name.endswith("__"):
            continue  # __name__, __builtins__: every interpreter has its own
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
            continue
        try:
            values[name] = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as err:  # noqa: BLE001 - whatever stops it is reported
            not_saved.append(f"{name}: {type(err).__name__}: {err}")
    state = (modules, values)
    try:
        with os.fdopen(fd, "wb") as sink:
            pickle.dump(state, sink, protocol=pickle.HIGHEST_PROTOCOL)
    except OSError as err:
        return {"exit_code": 1, "error": f"cannot save the globals: {err}"}
    return {"exit_code": 0, "error": None, "left_out": not_saved}


def load_state(scope, fd):
    """Loads the globals pickled in ``fd`` into ``scope``, modules first
    (a value may need one): the names that could not be, each with why."""
    import importlib
    import pickle

    try:
        with os.fdopen(fd, "rb") as source:
            state = pickle.load(source)
        modules, values = (dict(part) for part in state)
    except Exception as err:  # noqa: BLE001 - a damaged state is named, not fatal
        return [f"(every global): the saved globals cannot be read: {type(err).__name__}: {err}"]
    not_loaded = []
    for name, module in modules.items():
        try:
            scope[name] = importlib.import_module(module)
        except Exception as err:  # noqa: BLE001
            not_loaded.append(f"{name}: {type(err).__name__}: {err}")
    for name, pickled in values.items():
        try:
            scope[name] = pickle.loads(pickled)
        except Exception as err:  # noqa: BLE001
            not_loaded.append(f"{name}: {type(err).__name__}: {err}")
    return not_loaded
