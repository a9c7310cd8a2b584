"""Handles for registered hooks (module hooks, gradient hooks): remove() unregisters one."""
import itertools
import weakref

_handle_ids = itertools.count()


class RemovableHandle:
    """What a register_*hook returns: remove() unregisters the hook, as does leaving a `with` block.
    It holds the hook tables weakly, so a kept handle does not keep a deleted module's hooks alive."""

    def __init__(self, hooks, extra=()):
        self.hooks_dict_ref = weakref.ref(hooks)
        self.extra_dict_ref = tuple(weakref.ref(table) for table in extra)
        self.id = next(_handle_ids)

    def remove(self):
        for ref in (self.hooks_dict_ref, *self.extra_dict_ref):
            table = ref()
            if table is not None:
                table.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        self.remove()
