/* A plain replayed run's launch (runtime/replay.py's Replay.run_plain), in C.

Such a run points the slots its kernels read at its inputs' and outputs' memory, then calls the
native replay loop (replay.py's LOOP_SOURCE, built with the kernels' compiler). From Python that
is a cffi from_buffer per array and a cffi call: 1.1 us of a 64^3 matmul's realisation, whose
kernel takes 2-3. Here it is one call. replay.py keeps the Python version, used when this module is
not built.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int64_t (*replay_loop)(int64_t first, int64_t last, const void *plan, char **slots);

static PyObject *buffer_name;       /* "buffer": the attribute a node keeps its value in */

/* The address of `array`'s memory, C-contiguous; NULL with an error set when it has none. */
static char *address_of(PyObject *array)
{
    Py_buffer view;
    if (PyObject_GetBuffer(array, &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    char *address = view.buf;
    PyBuffer_Release(&view);          /* (the caller holds the array for the whole run) */
    if (address == NULL)
        PyErr_SetString(PyExc_BufferError, "an array without memory");
    return address;
}

/* run(loop, plan, slots, length, last, numbers, nodes, reads, outputs): point slots[numbers[i]]
   at the buffer of nodes[reads[i]] for each read, then at outputs[j] for the numbers after them,
   and run the replay loop (its address `loop`) over steps [0, last) of `plan` with the slot array
   at address `slots` (`length` slots long), the GIL released. Returns the step it stopped at (last
   when every check passed), or -1 when an input's node holds no value usable as C memory (nothing
   ran; the error is cleared: the run through the graph reports it). */
static PyObject *run(PyObject *module, PyObject *args)
{
    unsigned long long loop_address, plan_address, slots_address;
    Py_ssize_t length;
    long long last;
    PyObject *numbers, *nodes, *reads, *outputs;
    if (!PyArg_ParseTuple(args, "KKKnLO!O!O!O!", &loop_address, &plan_address, &slots_address, &length,
                          &last, &PyTuple_Type, &numbers, &PyList_Type, &nodes, &PyTuple_Type, &reads,
                          &PyTuple_Type, &outputs))
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(reads);
    if (PyTuple_GET_SIZE(numbers) != count + PyTuple_GET_SIZE(outputs)) {
        PyErr_SetString(PyExc_ValueError, "run: one slot number per read and per output");
        return NULL;
    }
    if (!loop_address || !plan_address || !slots_address) {
        PyErr_SetString(PyExc_ValueError, "run: a null address");
        return NULL;
    }
    char **slots = (char **)(uintptr_t)slots_address;
    /* the inputs' arrays, held until the loop returns (another thread may drop a node's buffer) */
    PyObject *held = PyTuple_New(count);
    if (held == NULL)
        return NULL;
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(numbers); i++) {
        Py_ssize_t number = PyLong_AsSsize_t(PyTuple_GET_ITEM(numbers, i));
        if (number < 0 || number >= length) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "run: slot %zd of %zd", number, length);
            goto done;
        }
        char *address;
        if (i < count) {
            Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(reads, i));
            if (k < 0 || k >= PyList_GET_SIZE(nodes)) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_IndexError, "run: read %zd of %zd nodes", k, PyList_GET_SIZE(nodes));
                goto done;
            }
            PyObject *buffer = PyObject_GetAttr(PyList_GET_ITEM(nodes, k), buffer_name);
            if (buffer == NULL)
                goto done;
            PyTuple_SET_ITEM(held, i, buffer);
            address = buffer == Py_None ? NULL : address_of(buffer);
            if (address == NULL) {
                PyErr_Clear();
                result = PyLong_FromLong(-1);
                goto done;
            }
        } else {
            address = address_of(PyTuple_GET_ITEM(outputs, i - count));
            if (address == NULL)
                goto done;
        }
        slots[number] = address;
    }
    int64_t stopped;
    Py_BEGIN_ALLOW_THREADS
    stopped = ((replay_loop)(uintptr_t)loop_address)(0, last, (const void *)(uintptr_t)plan_address, slots);
    Py_END_ALLOW_THREADS
    result = PyLong_FromLongLong(stopped);
done:
    Py_DECREF(held);          /* (a tuple's unset items are NULL, which it skips) */
    return result;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS,
     "run(loop, plan, slots, length, last, numbers, nodes, reads, outputs): fill the slots, run the loop."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__launch(void)
{
    buffer_name = PyUnicode_InternFromString("buffer");
    if (buffer_name == NULL)
        return NULL;
    PyObject *made = PyModule_Create(&module);      /* ABI: what runtime/replay.py expects */
    if (made != NULL && PyModule_AddIntConstant(made, "ABI", 2) < 0)
        Py_CLEAR(made);
    return made;
}
