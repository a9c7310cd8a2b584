/* Node building for a recorded composite's replay (ops/recorded.py's Template.replay), and the
description of a recorded call's arguments (its key: recorded.py's _arguments), in C.

A replay creates the nodes one call of the composite built, each from checked parts: Python spends
about 0.35 us per node setting its eighteen slots, 1.4 us of a 64^3 matmul's 2.7 us graph. Here a
node is allocated and its slots written through their offsets (the member descriptors of
Node.__slots__, read once by `configure`), which is what Node.replayed does, without the
interpreter. ops/node.py keeps the Python version, used when this module is not built.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* Node's slots, in the order `configure` is given their names */
enum { OP, INPUTS, ATTRS, SHAPE, DTYPE, SITE, COMPOSITE, DEVICE, REQUIRES_GRAD, LEAF, BUFFER, OWNER,
       GRAD_HOOKS, GRAD_GROUP, ID, SIGNATURE, RELEASED, REPLAYED_FROM, SLOTS };

static PyTypeObject *node_type;             /* ops.node.Node */
static Py_ssize_t offset[SLOTS];            /* byte offset of each slot in a Node */
static PyObject *next_id;                   /* a new node's id: ops.node.next_id */
static PyObject *mixed_devices;             /* raises DeviceError: ops.node._mixed_devices */

#define SLOT(node, k) (*(PyObject **)((char *)(node) + offset[k]))

static PyObject *configure(PyObject *module, PyObject *args)
{
    PyObject *type, *names, *ids, *mixed;
    if (!PyArg_ParseTuple(args, "O!O!OO", &PyType_Type, &type, &PyTuple_Type, &names, &ids, &mixed))
        return NULL;
    if (PyTuple_GET_SIZE(names) != SLOTS) {
        PyErr_Format(PyExc_ValueError, "configure: %d slot names expected, got %zd", SLOTS,
                     PyTuple_GET_SIZE(names));
        return NULL;
    }
    for (int k = 0; k < SLOTS; k++) {
        PyObject *descriptor = PyDict_GetItemWithError(((PyTypeObject *)type)->tp_dict,
                                                       PyTuple_GET_ITEM(names, k));
        if (descriptor == NULL || !PyObject_TypeCheck(descriptor, &PyMemberDescr_Type)) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "configure: %R is not a slot of %R",
                             PyTuple_GET_ITEM(names, k), type);
            return NULL;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descriptor)->d_member;
        if (member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "configure: slot %R holds no object", PyTuple_GET_ITEM(names, k));
            return NULL;
        }
        offset[k] = member->offset;
    }
    Py_INCREF(type);
    Py_INCREF(ids);
    Py_INCREF(mixed);
    Py_XSETREF(node_type, (PyTypeObject *)type);
    Py_XSETREF(next_id, ids);
    Py_XSETREF(mixed_devices, mixed);
    Py_RETURN_NONE;
}

/* A new node with every slot set (a reference taken to each value); NULL with an error set. */
static PyObject *new_node(PyObject *values[SLOTS])
{
    PyObject *node = node_type->tp_alloc(node_type, 0);
    if (node == NULL)
        return NULL;
    for (int k = 0; k < SLOTS; k++) {
        Py_INCREF(values[k]);
        SLOT(node, k) = values[k];
    }
    return node;
}

/* replay(steps, slots, site, composite): append to the list `slots` the node of each step, as
   Node.replayed builds it. A step is (op, attrs, shape, dtype, requires_grad, leaf, signature,
   input positions), its inputs slots[position] for each position (earlier slots holding nodes),
   its device its inputs' (mixed devices raise DeviceError); or those and the composite and device
   the node records (a recorded backward pass's step), which replace `composite` and the inputs'. */
static PyObject *replay(PyObject *module, PyObject *args)
{
    PyObject *steps, *slots, *site, *composite;
    if (!PyArg_ParseTuple(args, "O!O!OO", &PyTuple_Type, &steps, &PyList_Type, &slots, &site, &composite))
        return NULL;
    if (node_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "replay: configure() was not called");
        return NULL;
    }
    for (Py_ssize_t s = 0; s < PyTuple_GET_SIZE(steps); s++) {
        PyObject *step = PyTuple_GET_ITEM(steps, s);
        if (!PyTuple_Check(step) || (PyTuple_GET_SIZE(step) != 8 && PyTuple_GET_SIZE(step) != 10)
                || !PyTuple_Check(PyTuple_GET_ITEM(step, 7))) {
            PyErr_SetString(PyExc_TypeError, "replay: a step is a tuple of 8 or 10, its eighth a tuple");
            return NULL;
        }
        int recorded = PyTuple_GET_SIZE(step) == 10;       /* its composite and device given */
        PyObject *positions = PyTuple_GET_ITEM(step, 7);
        Py_ssize_t count = PyTuple_GET_SIZE(positions);
        PyObject *inputs = PyTuple_New(count);
        if (inputs == NULL)
            return NULL;
        PyObject *device = Py_None, *clash = NULL;
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(positions, i));
            if (k < 0 || k >= PyList_GET_SIZE(slots)) {
                Py_DECREF(inputs);
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_IndexError, "replay: input slot %zd of %zd", k, PyList_GET_SIZE(slots));
                return NULL;
            }
            PyObject *source = PyList_GET_ITEM(slots, k);
            if (Py_TYPE(source) != node_type) {
                Py_DECREF(inputs);
                PyErr_Format(PyExc_TypeError, "replay: input slot %zd holds %R, not a node", k, source);
                return NULL;
            }
            Py_INCREF(source);
            PyTuple_SET_ITEM(inputs, i, source);
            PyObject *other = SLOT(source, DEVICE);
            if (recorded || other == NULL || other == Py_None || other == device)
                continue;
            if (device == Py_None)
                device = other;
            else if (clash == NULL)
                clash = other;
        }
        PyObject *named = composite;
        if (recorded) {
            named = PyTuple_GET_ITEM(step, 8);
            device = PyTuple_GET_ITEM(step, 9);
        }
        PyObject *id = PyObject_CallNoArgs(next_id);
        if (id == NULL) {
            Py_DECREF(inputs);
            return NULL;
        }
        PyObject *values[SLOTS] = {
            [OP] = PyTuple_GET_ITEM(step, 0), [INPUTS] = inputs, [ATTRS] = PyTuple_GET_ITEM(step, 1),
            [SHAPE] = PyTuple_GET_ITEM(step, 2), [DTYPE] = PyTuple_GET_ITEM(step, 3), [SITE] = site,
            [COMPOSITE] = named, [DEVICE] = device, [REQUIRES_GRAD] = PyTuple_GET_ITEM(step, 4),
            [LEAF] = PyTuple_GET_ITEM(step, 5), [BUFFER] = Py_None, [OWNER] = Py_None,
            [GRAD_HOOKS] = Py_None, [GRAD_GROUP] = Py_None, [ID] = id,
            [SIGNATURE] = PyTuple_GET_ITEM(step, 6), [RELEASED] = Py_False, [REPLAYED_FROM] = Py_None,
        };
        PyObject *node = new_node(values);
        Py_DECREF(inputs);
        Py_DECREF(id);
        if (node == NULL)
            return NULL;
        if (clash != NULL) {      /* (the node names the user's line in the error) */
            int truthy = PyObject_IsTrue(composite);        /* (Python's `composite or op`) */
            PyObject *op = truthy > 0 ? composite : PyTuple_GET_ITEM(step, 0);
            PyObject *raised = PyObject_CallFunctionObjArgs(mixed_devices, op, device, clash, node, NULL);
            Py_DECREF(node);
            Py_XDECREF(raised);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "replay: mixed devices raised nothing");
            return NULL;
        }
        int failed = PyList_Append(slots, node);
        Py_DECREF(node);
        if (failed)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* arguments(itself, describe, args, nodes): recorded.py's _arguments, the description of a call's
   positional arguments (a tuple): a node not met before is appended to the list `nodes` and
   described as (shape, dtype, requires_grad), one met before as (Node, its number); a value whose
   type is in the tuple `itself` stands for itself; anything else is describe(value, nodes). */
static PyObject *arguments(PyObject *module, PyObject *args)
{
    PyObject *values, *nodes, *itself, *describe;
    if (!PyArg_ParseTuple(args, "O!OO!O!", &PyTuple_Type, &itself, &describe, &PyTuple_Type, &values,
                          &PyList_Type, &nodes))
        return NULL;
    if (node_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "arguments: configure() was not called");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(values);
    PyObject *described = PyTuple_New(count);
    if (described == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *value = PyTuple_GET_ITEM(values, i), *item = NULL;
        if (Py_TYPE(value) == node_type) {
            Py_ssize_t seen = -1;
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(nodes); k++)
                if (PyList_GET_ITEM(nodes, k) == value) {
                    seen = k;
                    break;
                }
            if (seen >= 0) {
                item = Py_BuildValue("(On)", (PyObject *)node_type, seen);
            } else {
                PyObject *shape = SLOT(value, SHAPE), *dtype = SLOT(value, DTYPE);
                PyObject *grad = SLOT(value, REQUIRES_GRAD);
                if (shape == NULL || dtype == NULL || grad == NULL) {
                    PyErr_SetString(PyExc_AttributeError, "arguments: a node without its shape, dtype or flag");
                } else if (PyList_Append(nodes, value) == 0) {
                    item = PyTuple_Pack(3, shape, dtype, grad);
                }
            }
        } else {
            int plain = 0;
            for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(itself); t++)
                if ((PyObject *)Py_TYPE(value) == PyTuple_GET_ITEM(itself, t)) {
                    plain = 1;
                    break;
                }
            if (plain) {
                Py_INCREF(value);
                item = value;
            } else {
                item = PyObject_CallFunctionObjArgs(describe, value, nodes, NULL);
            }
        }
        if (item == NULL) {
            Py_DECREF(described);
            return NULL;
        }
        PyTuple_SET_ITEM(described, i, item);
    }
    return described;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(Node, slot names, next_id, mixed_devices): what replay builds nodes from."},
    {"replay", replay, METH_VARARGS,
     "replay(steps, slots, site, composite): append each step's new node to the list slots."},
    {"arguments", arguments, METH_VARARGS,
     "arguments(itself, describe, args, nodes): the description of a recorded call's arguments."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nodes", NULL, -1, methods};

/* ABI: what ops/node_replay.py expects, so that a module built from an older source is set aside */
PyMODINIT_FUNC PyInit__nodes(void)
{
    PyObject *made = PyModule_Create(&module);
    if (made != NULL && PyModule_AddIntConstant(made, "ABI", 2) < 0)
        Py_CLEAR(made);
    return made;
}
