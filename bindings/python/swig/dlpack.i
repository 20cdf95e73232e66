/* DLTensor arguments: any object implementing the DLPack protocol (`__dlpack__`: numpy, PyTorch,
 * CuPy, JAX, ...) or a "dltensor" PyCapsule, passed to the library without a copy.
 *
 * Borrowing, not consuming: we call obj.__dlpack__(stream=None), take the DLManagedTensor out of
 * the "dltensor" capsule and hand &managed->dl_tensor to the library for the duration of the
 * call. The capsule is never renamed to "used_dltensor": under the protocol that rename means
 * the consumer took ownership and will call the deleter itself. We do not take ownership, so the
 * capsule keeps it, and releasing the capsule after the call (freearg) runs the producer's
 * deleter, which drops the producer's reference. The capsule holds the producer's memory alive
 * for the whole call, including while the GIL is released.
 *
 * stream=None: on CPU the protocol requires it; on CUDA it asks the producer for no extra
 * synchronisation (PyTorch) or for the legacy default stream (CuPy), and the caller passes the
 * stream its tensors are ordered on as the function's own `stream` argument.
 *
 * Read-only inputs: numpy refuses to export a read-only array through DLPack 0.x (which cannot
 * flag read-only memory). For the const DLTensor* inputs only, such an object is borrowed through
 * the buffer protocol instead (still zero-copy); outputs must be writable and get the producer's
 * error, as do inputs refused for another reason (a writable array in a foreign byte order). */

%{
/* A DLTensor that views a Py_buffer: lives in a capsule so that it is released like the others. */
typedef struct {
  DLTensor tensor;
  Py_buffer view;
  int64_t shape[64];
  int64_t strides[64];
} stria_py_buffer_tensor;

static void stria_py_buffer_tensor_free(PyObject* capsule) {
  stria_py_buffer_tensor* b = (stria_py_buffer_tensor*)PyCapsule_GetPointer(capsule, "stria.buffer_tensor");
  if (!b) return;
  PyBuffer_Release(&b->view);
  PyMem_Free(b);
}

/* The DLPack dtype of a struct-module format character (native byte order only): 1, or 0 if it
 * is not a plain number type, or -1 if its byte order is not the native one. */
static int stria_py_buffer_dtype(const char* format, Py_ssize_t itemsize, DLDataType* dtype) {
  if (!format) format = "B";
  if (*format == '@' || *format == '=' || (*format == '<' && PY_LITTLE_ENDIAN) || (*format == '>' && PY_BIG_ENDIAN))
    ++format;
  else if (*format == '<' || *format == '>' || *format == '!')
    return -1;
  if (format[0] == '\0' || format[1] != '\0') return 0;
  dtype->lanes = 1;
  dtype->bits = (uint8_t)(itemsize * 8);
  switch (format[0]) {
    case 'e': case 'f': case 'd': dtype->code = kDLFloat; return 1;
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n': dtype->code = kDLInt; return 1;
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N': case '?': dtype->code = kDLUInt; return 1;
    default: return 0;
  }
}

/* Wraps a read-only buffer of obj as a DLTensor in a capsule; NULL with an exception if it cannot. */
static PyObject* stria_py_buffer_capsule(PyObject* obj, const char* func, const char* arg) {
  stria_py_buffer_tensor* b = (stria_py_buffer_tensor*)PyMem_Calloc(1, sizeof *b);
  if (!b) return PyErr_NoMemory();
  if (PyObject_GetBuffer(obj, &b->view, PyBUF_RECORDS_RO) < 0) {
    PyMem_Free(b);
    return NULL;
  }
  const char* problem = NULL;
  const int dtype = stria_py_buffer_dtype(b->view.format, b->view.itemsize, &b->tensor.dtype);
  if (b->view.ndim > 64) problem = "it has more than 64 dimensions";
  else if (dtype < 0) problem = "its items are not in native byte order";
  else if (dtype == 0) problem = "its buffer format is not a plain number type";
  for (int i = 0; !problem && i < b->view.ndim; ++i) {
    if (b->view.strides[i] % b->view.itemsize != 0) problem = "its strides are not a multiple of its item size";
    b->shape[i] = b->view.shape[i];
    b->strides[i] = b->view.strides[i] / b->view.itemsize;
  }
  if (problem) {
    PyBuffer_Release(&b->view);
    PyMem_Free(b);
    return PyErr_Format(PyExc_TypeError, "%s(): argument '%s' (read-only %.100s) cannot be borrowed: %s", func, arg,
                        Py_TYPE(obj)->tp_name, problem);
  }
  b->tensor.data = b->view.buf;
  b->tensor.device.device_type = kDLCPU;
  b->tensor.device.device_id = 0;
  b->tensor.ndim = b->view.ndim;
  b->tensor.shape = b->shape;
  b->tensor.strides = b->strides;
  b->tensor.byte_offset = 0;
  PyObject* capsule = PyCapsule_New(b, "stria.buffer_tensor", stria_py_buffer_tensor_free);
  if (!capsule) {
    PyBuffer_Release(&b->view);
    PyMem_Free(b);
  }
  return capsule;
}

/* Puts "func(): argument 'arg': " in front of the pending exception's message, for the plain
 * builtin errors a producer raises (the original becomes the __cause__); others pass unchanged. */
static void stria_py_prefix_error(const char* func, const char* arg) {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* original = PyErr_GetRaisedException();
#else
  PyObject *type, *original, *traceback;
  PyErr_Fetch(&type, &original, &traceback);
  PyErr_NormalizeException(&type, &original, &traceback);
  if (original && traceback) PyException_SetTraceback(original, traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
#endif
  if (!original) return;
  PyObject* cls = (PyObject*)Py_TYPE(original);
  PyObject* text = NULL;
  PyObject* replacement = NULL;
  if (cls == PyExc_BufferError || cls == PyExc_TypeError || cls == PyExc_ValueError) {
    text = PyUnicode_FromFormat("%s(): argument '%s': %S", func, arg, original);
    if (text) replacement = PyObject_CallOneArg(cls, text);
  }
  Py_XDECREF(text);
  if (!replacement) {
    PyErr_Clear();
    PyErr_SetObject(cls, original); /* unchanged */
    Py_DECREF(original);
    return;
  }
  PyException_SetCause(replacement, original); /* steals original */
  PyErr_SetObject(cls, replacement);
  Py_DECREF(replacement);
}

/* Whether obj exports a read-only buffer. Keeps the pending exception. */
static int stria_py_buffer_is_read_only(PyObject* obj) {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* pending = PyErr_GetRaisedException();
#else
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
#endif
  Py_buffer view;
  int read_only = 0;
  if (PyObject_GetBuffer(obj, &view, PyBUF_RECORDS_RO) == 0) {
    read_only = view.readonly;
    PyBuffer_Release(&view);
  }
  PyErr_Clear();
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(pending);
#else
  PyErr_Restore(type, value, traceback);
#endif
  return read_only;
}

/* Borrows the DLTensor behind obj. On success returns it and stores in *keep a new reference
 * that holds the memory alive until the caller releases it after the call; on failure returns
 * NULL with a Python exception set. `writable`: the library writes through it. */
static DLTensor* stria_py_dltensor(PyObject* obj, int writable, const char* func, const char* arg, PyObject** keep) {
  *keep = NULL;
  PyObject* capsule = NULL;
  if (PyCapsule_CheckExact(obj)) {
    Py_INCREF(obj);
    capsule = obj;
  } else {
    PyObject* method = PyObject_GetAttrString(obj, "__dlpack__");
    if (!method) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError,
                   "%s(): argument '%s' must be a tensor implementing the DLPack protocol (__dlpack__: numpy, "
                   "torch, cupy, jax, ...), not %.100s",
                   func, arg, Py_TYPE(obj)->tp_name);
      return NULL;
    }
    PyObject* args = PyTuple_New(0);
    PyObject* kwargs = Py_BuildValue("{s:O}", "stream", Py_None);
    if (args && kwargs) capsule = PyObject_Call(method, args, kwargs);
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    Py_DECREF(method);
    if (!capsule) {
      /* A read-only array: borrow its buffer instead. A writable one was refused for another
       * reason (byte order, dtype), which is the producer's to tell. */
      if (!writable && PyErr_ExceptionMatches(PyExc_BufferError) && PyObject_CheckBuffer(obj) &&
          stria_py_buffer_is_read_only(obj)) {
        PyErr_Clear();
        *keep = stria_py_buffer_capsule(obj, func, arg);
        return *keep ? &((stria_py_buffer_tensor*)PyCapsule_GetPointer(*keep, "stria.buffer_tensor"))->tensor : NULL;
      }
      stria_py_prefix_error(func, arg);
      return NULL;
    }
  }
  if (!PyCapsule_IsValid(capsule, "dltensor")) {
    const char* name = PyCapsule_CheckExact(capsule) ? PyCapsule_GetName(capsule) : NULL;
    PyErr_Format(PyExc_TypeError,
                 "%s(): argument '%s': expected a DLPack capsule named \"dltensor\", got %s%s%s", func, arg,
                 name ? "one named \"" : "a ", name ? name : Py_TYPE(capsule)->tp_name,
                 name ? (strcmp(name, "used_dltensor") == 0 ? "\" (already consumed)" : "\"") : "");
    Py_DECREF(capsule);
    return NULL;
  }
  DLManagedTensor* managed = (DLManagedTensor*)PyCapsule_GetPointer(capsule, "dltensor");
  if (!managed) {
    Py_DECREF(capsule);
    return NULL;
  }
  *keep = capsule;
  return &managed->dl_tensor;
}
%}

%typemap(in) const DLTensor* (PyObject* keep = NULL) {
  $1 = stria_py_dltensor($input, 0, "$symname", "$1_name", &keep);
  if (!$1) SWIG_fail;
}
%typemap(freearg) const DLTensor* {
  Py_XDECREF(keep$argnum);
}

%typemap(in) DLTensor* (PyObject* keep = NULL) {
  $1 = stria_py_dltensor($input, 1, "$symname", "$1_name", &keep);
  if (!$1) SWIG_fail;
}
%typemap(freearg) DLTensor* {
  Py_XDECREF(keep$argnum);
}

/* The DLPack device of a context config: a (device_type, device_id) tuple, e.g. (kDLCPU, 0). */
%typemap(out) DLDevice {
  $result = Py_BuildValue("(ii)", (int)$1.device_type, (int)$1.device_id);
}
%typemap(in) DLDevice {
  int type = 0, id = 0;
  if (!PyTuple_Check($input)) {
    PyErr_Format(PyExc_TypeError, "a device is a (device_type, device_id) tuple of ints, not %.100s",
                 Py_TYPE($input)->tp_name);
    SWIG_fail;
  }
  if (!PyArg_ParseTuple($input, "ii;a device is a (device_type, device_id) tuple of ints", &type, &id)) SWIG_fail;
  $1.device_type = (DLDeviceType)type;
  $1.device_id = id;
}

%constant int kDLCPU = kDLCPU;
%constant int kDLCUDA = kDLCUDA;
