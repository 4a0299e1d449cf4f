/* minibroker.client.records._encoder: the producer's per-record encoding, compiled.

   Pure: no I/O; it runs with the GIL held and never releases it. A RecordsBuilder belongs to one
   producer task (like the BatchBuilder that holds it); it is not thread-safe. Its output is
   byte-identical to the pure Python path of minibroker.client.records.builder.BatchBuilder, which
   stays the reference and the fallback (tests/unit/test_records_encoder.py compares the two).
   Only the records section is built here; the batch header, compression and CRC stay in Python
   (once per batch, BatchBuilder.build()).

   Each record (Kafka's DefaultRecord, docs/protocol.md section 23):

       length varint | attributes int8 (always 0) | timestampDelta varlong | offsetDelta varint |
       keyLength varint | key | valueLength varint | value | headersCount varint |
       (headerKeyLength varint | headerKey utf8 | headerValueLength varint | headerValue)*

   `length` counts the bytes after itself; a -1 length means null; all varints are zig-zag
   encoded (Kafka's ByteUtils.writeVarint / writeVarlong). The timestamp delta is relative to the
   first record's timestamp (the batch's baseTimestamp), the offset delta is the record's index.

   The encoded records live in one growable buffer (doubling, so growth is amortized); `append`
   writes a record after the committed bytes and commits it only when it fits, so a refused or
   failed append leaves the builder exactly as it was. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define HEADER_SIZE 61      /* the v2 batch header that BatchBuilder.build() writes in front */
#define MAX_VARINT 5        /* the longest int32 varint */
#define MAX_VARLONG 10      /* the longest int64 varint */
#define INITIAL_CAPACITY 512

/* ---------------------------------------------------------------------------------------------
   Varints */

static inline uint32_t
zigzag32(int32_t n)
{
    /* gcc, clang and MSVC shift a negative int arithmetically: n >> 31 is 0 or all ones. */
    return ((uint32_t)n << 1) ^ (uint32_t)(n >> 31);
}

static inline uint64_t
zigzag64(int64_t n)
{
    return ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
}

static inline Py_ssize_t
uvarint_size(uint64_t v)
{
    Py_ssize_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Write `v` as an unsigned LEB128 varint at `p`; returns the bytes written. */
static inline Py_ssize_t
put_uvarint(unsigned char *p, uint64_t v)
{
    Py_ssize_t n = 0;
    while (v >= 0x80) {
        p[n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (unsigned char)v;
    return n;
}

/* The size of an int32 varint field for a length; -1 (null) is one byte. */
static inline Py_ssize_t
length_field_size(Py_ssize_t len)
{
    return uvarint_size(zigzag32((int32_t)len));
}

/* The pure path's encode_varint refuses a value outside int32 with these words. */
static int
check_int32(Py_ssize_t value)
{
    if (value > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "varint %zd is outside int32", value);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   Keys, values and header values: bytes, bytearray, C-contiguous memoryview, str or None */

typedef struct {
    const char *data;
    Py_ssize_t len;   /* -1: null */
    Py_buffer view;   /* held for a memoryview until field_release */
    int has_view;
} Field;

/* Messages follow minibroker.client.producer_record.as_bytes; `what` is "key", "value" or
   "header 'name' value". The type's __name__, not its qualified tp_name. */
static void
set_type_error(PyObject *obj, const char *what, PyObject *header_name)
{
    PyObject *type_name = PyType_GetName(Py_TYPE(obj));
    if (type_name == NULL) {
        return;
    }
    if (header_name != NULL) {
        PyErr_Format(PyExc_TypeError,
                     "record header %R value must be bytes, str or None, not %U; "
                     "serialize it first",
                     header_name, type_name);
    }
    else {
        PyErr_Format(PyExc_TypeError,
                     "record %s must be bytes, str or None, not %U; serialize it first",
                     what, type_name);
    }
    Py_DECREF(type_name);
}

static int
field_get(PyObject *obj, Field *f, const char *what, PyObject *header_name)
{
    f->has_view = 0;
    if (obj == Py_None) {
        f->data = NULL;
        f->len = -1;
        return 0;
    }
    if (PyBytes_Check(obj)) {
        f->data = PyBytes_AS_STRING(obj);
        f->len = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyUnicode_Check(obj)) {
        /* The UTF-8 form is cached in the str (free for ASCII): no new object per record. */
        f->data = PyUnicode_AsUTF8AndSize(obj, &f->len);
        return f->data == NULL ? -1 : 0;
    }
    if (PyByteArray_Check(obj)) {
        /* No Python code runs before the bytes are copied, so nothing can resize it. */
        f->data = PyByteArray_AS_STRING(obj);
        f->len = PyByteArray_GET_SIZE(obj);
        return 0;
    }
    if (PyMemoryView_Check(obj)) {
        /* PyBUF_SIMPLE: the bytes in C order, whatever the format (as bytes(view) has them). A
           released view raises ValueError here, like the pure path's view.c_contiguous. */
        if (PyObject_GetBuffer(obj, &f->view, PyBUF_SIMPLE) < 0) {
            if (PyErr_ExceptionMatches(PyExc_BufferError)) {
                PyErr_Clear();
                if (header_name != NULL) {
                    PyErr_Format(PyExc_TypeError,
                                 "record header %R value must be a C-contiguous memoryview; "
                                 "copy it with bytes() first",
                                 header_name);
                }
                else {
                    PyErr_Format(PyExc_TypeError,
                                 "record %s must be a C-contiguous memoryview; "
                                 "copy it with bytes() first",
                                 what);
                }
            }
            return -1;
        }
        f->has_view = 1;
        f->data = (const char *)f->view.buf;
        f->len = f->view.len;
        return 0;
    }
    set_type_error(obj, what, header_name);
    return -1;
}

static void
field_release(Field *f)
{
    if (f->has_view) {
        PyBuffer_Release(&f->view);
        f->has_view = 0;
    }
}

/* keyLength/valueLength varint and the bytes, at p; returns the bytes written. */
static inline Py_ssize_t
put_field(unsigned char *p, const Field *f)
{
    Py_ssize_t n = put_uvarint(p, zigzag32((int32_t)f->len));
    if (f->len > 0) {
        memcpy(p + n, f->data, (size_t)f->len);
        n += f->len;
    }
    return n;
}

static inline Py_ssize_t
field_size(const Field *f)
{
    return length_field_size(f->len) + (f->len > 0 ? f->len : 0);
}

/* ---------------------------------------------------------------------------------------------
   Arguments checked as the pure path checks them */

/* minibroker.client.producer_record.checked_timestamp, with its messages. */
static int
checked_timestamp(PyObject *obj, int64_t *out)
{
    PyObject *value;
    long long v;
    int overflow;

    if (PyLong_CheckExact(obj)) {
        v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (!overflow && v >= 0) {
            *out = (int64_t)v;
            return 0;
        }
        if (v == -1 && PyErr_Occurred()) {
            return -1;
        }
        Py_INCREF(obj);
        value = obj;
    }
    else {
        if (PyBool_Check(obj)) {
            PyErr_SetString(PyExc_TypeError,
                            "timestamp_ms must be an int (ms since the epoch) or None, "
                            "not a bool");
            return -1;
        }
        value = PyNumber_Index(obj);
        if (value == NULL) {
            if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyObject *type_name = PyType_GetName(Py_TYPE(obj));
                PyErr_Clear();
                if (type_name != NULL) {
                    PyErr_Format(PyExc_TypeError,
                                 "timestamp_ms must be an int (ms since the epoch) or None, "
                                 "not %U",
                                 type_name);
                    Py_DECREF(type_name);
                }
            }
            return -1;
        }
        v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(value);
            return -1;
        }
        if (!overflow && v >= 0) {
            Py_DECREF(value);
            *out = (int64_t)v;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError,
                 "Invalid timestamp: %S. Timestamp should always be non-negative or None "
                 "(and at most %lld).",
                 value, (long long)INT64_MAX);
    Py_DECREF(value);
    return -1;
}

/* `name, value = pair` with Python's own messages (CPython 3.11's unpack_iterable). On success
   *name and *value are new references. */
static int
unpack_pair(PyObject *pair, PyObject **name, PyObject **value)
{
    PyObject *it, *items[2], *extra;
    Py_ssize_t i;

    if ((PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2)
        || (PyList_CheckExact(pair) && PyList_GET_SIZE(pair) == 2)) {
        PyObject **src = PySequence_Fast_ITEMS(pair);
        *name = Py_NewRef(src[0]);
        *value = Py_NewRef(src[1]);
        return 0;
    }
#if PY_VERSION_HEX >= 0x030C0000
    /* 3.12 names the size of a tuple or list that is too long. */
    if ((PyTuple_CheckExact(pair) || PyList_CheckExact(pair)) && Py_SIZE(pair) > 2) {
        PyErr_Format(PyExc_ValueError, "too many values to unpack (expected 2, got %zd)",
                     Py_SIZE(pair));
        return -1;
    }
#endif
    it = PyObject_GetIter(pair);
    if (it == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError) && Py_TYPE(pair)->tp_iter == NULL
            && !PySequence_Check(pair)) {
            PyErr_Format(PyExc_TypeError, "cannot unpack non-iterable %.200s object",
                         Py_TYPE(pair)->tp_name);
        }
        return -1;
    }
    for (i = 0; i < 2; i++) {
        items[i] = PyIter_Next(it);
        if (items[i] == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError,
                             "not enough values to unpack (expected 2, got %zd)", i);
            }
            goto fail;
        }
    }
    extra = PyIter_Next(it);
    if (extra != NULL) {
        Py_DECREF(extra);
        PyErr_SetString(PyExc_ValueError, "too many values to unpack (expected 2)");
        goto fail;
    }
    if (PyErr_Occurred()) {
        goto fail;
    }
    Py_DECREF(it);
    *name = items[0];
    *value = items[1];
    return 0;
fail:
    while (i-- > 0) {
        Py_DECREF(items[i]);
    }
    Py_DECREF(it);
    return -1;
}

/* ---------------------------------------------------------------------------------------------
   RecordsBuilder */

/* ---------------------------------------------------------------------------------------------
   ByteCount: the producer's buffered bytes, added to by every builder bound to it as it commits a
   record (the header's 61 bytes with a batch's first record), so the accumulator keeps its memory
   bound (buffer_memory) with no Python arithmetic per record. */

typedef struct {
    PyObject_HEAD
    long long value;
} ByteCount;

static PyObject *
ByteCount_add(ByteCount *self, PyObject *arg)
{
    long long delta = PyLong_AsLongLong(arg);

    if (delta == -1 && PyErr_Occurred()) {
        return NULL;
    }
    self->value += delta;
    Py_RETURN_NONE;
}

static PyObject *
ByteCount_get_value(ByteCount *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->value);
}

static PyMethodDef ByteCount_methods[] = {
    {"add", (PyCFunction)ByteCount_add, METH_O,
     "add($self, delta, /)\n--\n\nAdd delta (negative to take bytes off)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ByteCount_getset[] = {
    {"value", (getter)ByteCount_get_value, NULL, "The bytes counted.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ByteCountType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "minibroker.client.records._encoder.ByteCount",
    .tp_basicsize = sizeof(ByteCount),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ByteCount()\n--\n\nA count of bytes that bound builders add to as they commit records.",
    .tp_methods = ByteCount_methods,
    .tp_getset = ByteCount_getset,
    .tp_new = PyType_GenericNew,
};

typedef struct {
    PyObject_HEAD
    unsigned char *buf;          /* the records section; buf[0:len] holds the committed records */
    Py_ssize_t len;
    Py_ssize_t cap;              /* bytes allocated at buf; len <= cap */
    long long batch_size;        /* a larger Python int is clamped: the comparisons are the same */
    int32_t count;               /* records committed; the next record's offset delta */
    int64_t base_timestamp;      /* the first record's timestamp; 0 while empty */
    int64_t max_timestamp;       /* the largest record timestamp; 0 while empty */
    Py_ssize_t last_record_size; /* bytes the last committed record took, length included */
    int busy;                    /* inside append: Python code a header pair runs may not re-enter */
    /* Set by bind() (the producer's accumulator): append_future's tuple type and the batch's
       shared result, and the count every committed record is added to. None hold a reference back
       to this builder, so there is no cycle. */
    PyTypeObject *future_type;
    PyObject *result;
    ByteCount *counter;
} RecordsBuilder;

/* Make room for `end` bytes at buf (doubling). */
static int
reserve(RecordsBuilder *self, Py_ssize_t end)
{
    Py_ssize_t cap;
    unsigned char *p;

    if (end <= self->cap) {
        return 0;
    }
    cap = self->cap > 0 ? self->cap : INITIAL_CAPACITY;
    while (cap < end) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            cap = end;
            break;
        }
        cap *= 2;
    }
    p = PyMem_Realloc(self->buf, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->buf = p;
    self->cap = cap;
    return 0;
}

/* Does a record of `record_size` bytes fit? An empty builder takes any one record (Kafka's rule:
   a record larger than batch.size still gets a batch of its own). */
static inline int
fits(const RecordsBuilder *self, Py_ssize_t record_size)
{
    return self->count == 0
           || (long long)HEADER_SIZE + self->len + record_size <= self->batch_size;
}

static void
commit(RecordsBuilder *self, int64_t timestamp, Py_ssize_t record_size)
{
    if (self->counter != NULL) {
        self->counter->value += record_size + (self->count == 0 ? HEADER_SIZE : 0);
    }
    if (self->count == 0) {
        self->base_timestamp = timestamp;
        self->max_timestamp = timestamp;
    }
    else if (timestamp > self->max_timestamp) {
        self->max_timestamp = timestamp;
    }
    self->len += record_size;
    self->last_record_size = record_size;
    self->count++;
}

/* Write the headers' part of a record at buf[*pos:] (headersCount was written already),
   growing the buffer as needed; `seq` is a list or tuple of n pairs. */
static int
put_headers(RecordsBuilder *self, PyObject *seq, Py_ssize_t n, Py_ssize_t *pos)
{
    Py_ssize_t i;

    for (i = 0; i < n; i++) {
        PyObject *pair, *name, *value;
        const char *name_data;
        Py_ssize_t name_len;
        Field f;
        int ok;

        /* A list can change size while a pair's own iterator runs Python code. */
        if (i >= PySequence_Fast_GET_SIZE(seq)) {
            PyErr_SetString(PyExc_RuntimeError, "record headers changed size during append");
            return -1;
        }
        pair = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));
        ok = unpack_pair(pair, &name, &value);
        Py_DECREF(pair);
        if (ok < 0) {
            return -1;
        }
        ok = -1;
        if (!PyUnicode_Check(name)) {
            PyObject *type_name = PyType_GetName(Py_TYPE(name));
            if (type_name != NULL) {
                PyErr_Format(PyExc_TypeError, "header names must be str, got %U", type_name);
                Py_DECREF(type_name);
            }
            goto next;
        }
        name_data = PyUnicode_AsUTF8AndSize(name, &name_len);
        if (name_data == NULL || check_int32(name_len) < 0) {
            goto next;
        }
        if (field_get(value, &f, NULL, name) < 0) {
            goto next;
        }
        if (check_int32(f.len) < 0
            || reserve(self, *pos + MAX_VARINT + name_len + field_size(&f)) < 0) {
            field_release(&f);
            goto next;
        }
        *pos += put_uvarint(self->buf + *pos, zigzag32((int32_t)name_len));
        memcpy(self->buf + *pos, name_data, (size_t)name_len);
        *pos += name_len;
        *pos += put_field(self->buf + *pos, &f);
        field_release(&f);
        ok = 0;
    next:
        Py_DECREF(name);
        Py_DECREF(value);
        if (ok < 0) {
            return -1;
        }
    }
    if (n != PySequence_Fast_GET_SIZE(seq)) {
        PyErr_SetString(PyExc_RuntimeError, "record headers changed size during append");
        return -1;
    }
    return 0;
}

/* Encode one record after the committed ones. Returns 1 (committed), 0 (does not fit: nothing
   changed) or -1 (an exception is set; nothing changed). The checks come in the pure path's
   order: key, value, headers, then the record's length, then the fit. */
static int
encode_record(RecordsBuilder *self, int64_t timestamp, PyObject *key, PyObject *value,
              PyObject *headers)
{
    Field k, v;
    PyObject *seq = NULL;
    Py_ssize_t n_headers = 0, fixed, reserved, start, pos, body, prefix, record_size;
    int64_t delta = self->count ? timestamp - self->base_timestamp : 0;
    int rc = -1;

    if (self->count == INT32_MAX) {
        return check_int32((Py_ssize_t)self->count + 1);
    }
    if (field_get(key, &k, "key", NULL) < 0) {
        return -1;
    }
    if (check_int32(k.len) < 0) {
        field_release(&k);
        return -1;
    }
    if (field_get(value, &v, "value", NULL) < 0) {
        field_release(&k);
        return -1;
    }
    if (check_int32(v.len) < 0) {
        goto done;
    }
    /* The pure path skips any falsy headers (None, (), []) and encodes len(headers) pairs. */
    if (headers != Py_None) {
        int truth = PyObject_IsTrue(headers);
        if (truth < 0) {
            goto done;
        }
        if (truth) {
            n_headers = PyObject_Size(headers);
            if (n_headers < 0) {
                goto done;
            }
            seq = PySequence_Fast(headers, "record headers must be a sequence of pairs");
            if (seq == NULL) {
                goto done;
            }
        }
    }

    /* attributes | timestampDelta | offsetDelta | key field | value field | headersCount */
    fixed = 1 + uvarint_size(zigzag64(delta)) + uvarint_size(zigzag32(self->count))
            + field_size(&k) + field_size(&v) + uvarint_size(zigzag32((int32_t)n_headers));
    if (n_headers == 0) {
        /* The usual case: the length is known before anything is written, so a record that does
           not fit costs no copy, and the record is written in place. */
        if (check_int32(fixed) < 0) {
            goto done;
        }
        reserved = uvarint_size(zigzag32((int32_t)fixed));
        if (!fits(self, reserved + fixed)) {
            rc = 0;
            goto done;
        }
    }
    else {
        /* Headers are written as they are read; the length goes in front afterwards. */
        reserved = MAX_VARINT;
    }
    start = self->len;
    if (reserve(self, start + reserved + fixed) < 0) {
        goto done;
    }
    pos = start + reserved;
    self->buf[pos++] = 0; /* attributes */
    pos += put_uvarint(self->buf + pos, zigzag64(delta));
    pos += put_uvarint(self->buf + pos, zigzag32(self->count));
    pos += put_field(self->buf + pos, &k);
    pos += put_field(self->buf + pos, &v);
    pos += put_uvarint(self->buf + pos, zigzag32((int32_t)n_headers));
    /* Key and value are copied: let them go before any Python code a header pair may run. */
    field_release(&k);
    field_release(&v);
    if (n_headers > 0 && put_headers(self, seq, n_headers, &pos) < 0) {
        goto done;
    }

    body = pos - start - reserved;
    if (check_int32(body) < 0) {
        goto done;
    }
    prefix = uvarint_size(zigzag32((int32_t)body));
    record_size = prefix + body;
    if (!fits(self, record_size)) {
        rc = 0;
        goto done;
    }
    if (prefix != reserved) {
        memmove(self->buf + start + prefix, self->buf + start + reserved, (size_t)body);
    }
    put_uvarint(self->buf + start, zigzag32((int32_t)body));
    commit(self, timestamp, record_size);
    rc = 1;
done:
    field_release(&k);
    field_release(&v);
    Py_XDECREF(seq);
    return rc;
}

static int
enter(RecordsBuilder *self)
{
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "RecordsBuilder is already appending");
        return -1;
    }
    self->busy = 1;
    return 0;
}

static PyObject *
RecordsBuilder_append(RecordsBuilder *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t timestamp;
    int rc;

    if (nargs < 3 || nargs > 4) {
        PyErr_Format(PyExc_TypeError,
                     "append() takes from 3 to 4 positional arguments but %zd were given",
                     nargs);
        return NULL;
    }
    if (checked_timestamp(args[0], &timestamp) < 0 || enter(self) < 0) {
        return NULL;
    }
    rc = encode_record(self, timestamp, args[1], args[2], nargs == 4 ? args[3] : Py_None);
    self->busy = 0;
    if (rc < 0) {
        return NULL;
    }
    return PyLong_FromLong(rc ? (long)self->count - 1 : -1L);
}

/* append, answered the way the producer's accumulator needs: the record's future, a
   future_type tuple (result, index, timestamp) as FutureRecordMetadata.of makes it, or None when
   the record does not fit. Needs bind() first. */
static PyObject *
RecordsBuilder_append_future(RecordsBuilder *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t timestamp;
    int rc;
    PyObject *future, *index;

    if (nargs < 3 || nargs > 4) {
        PyErr_Format(PyExc_TypeError,
                     "append_future() takes from 3 to 4 positional arguments but %zd were given",
                     nargs);
        return NULL;
    }
    if (self->future_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "append_future() needs bind() first");
        return NULL;
    }
    if (checked_timestamp(args[0], &timestamp) < 0 || enter(self) < 0) {
        return NULL;
    }
    rc = encode_record(self, timestamp, args[1], args[2], nargs == 4 ? args[3] : Py_None);
    self->busy = 0;
    if (rc < 0) {
        return NULL;
    }
    if (rc == 0) {
        Py_RETURN_NONE;
    }
    index = PyLong_FromLong((long)self->count - 1);
    if (index == NULL) {
        return NULL;
    }
    future = self->future_type->tp_alloc(self->future_type, 3);
    if (future == NULL) {
        Py_DECREF(index);
        return NULL;
    }
    Py_INCREF(self->result);
    PyTuple_SET_ITEM(future, 0, self->result);
    PyTuple_SET_ITEM(future, 1, index);
    Py_INCREF(args[0]);
    PyTuple_SET_ITEM(future, 2, args[0]);
    return future;
}

static PyObject *
RecordsBuilder_bind(RecordsBuilder *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *type, *result, *counter;

    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "bind() takes 3 positional arguments but %zd were given",
                     nargs);
        return NULL;
    }
    type = args[0];
    result = args[1];
    counter = args[2];
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "bind() needs a subclass of tuple as its future type");
        return NULL;
    }
    if (counter != Py_None && !PyObject_TypeCheck(counter, &ByteCountType)) {
        PyErr_SetString(PyExc_TypeError, "bind() needs a ByteCount or None as its counter");
        return NULL;
    }
    if (self->count != 0 || self->future_type != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind() is for a new, unbound builder");
        return NULL;
    }
    Py_INCREF(type);
    self->future_type = (PyTypeObject *)type;
    Py_INCREF(result);
    self->result = result;
    if (counter != Py_None) {
        Py_INCREF(counter);
        self->counter = (ByteCount *)counter;
    }
    Py_RETURN_NONE;
}

static PyObject *
RecordsBuilder_append_values(RecordsBuilder *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *values, *keys;
    Py_ssize_t i, n;
    int64_t timestamp;
    int rc = 1;

    if (nargs < 2 || nargs > 3) {
        PyErr_Format(PyExc_TypeError,
                     "append_values() takes from 2 to 3 positional arguments but %zd were given",
                     nargs);
        return NULL;
    }
    values = args[1];
    keys = nargs == 3 ? args[2] : Py_None;
    if (checked_timestamp(args[0], &timestamp) < 0) {
        return NULL;
    }
    if (!PyList_Check(values) && !PyTuple_Check(values)) {
        PyObject *type_name = PyType_GetName(Py_TYPE(values));
        if (type_name != NULL) {
            PyErr_Format(PyExc_TypeError, "values must be a list or tuple, not %U", type_name);
            Py_DECREF(type_name);
        }
        return NULL;
    }
    n = PySequence_Fast_GET_SIZE(values);
    if (keys != Py_None) {
        if (!PyList_Check(keys) && !PyTuple_Check(keys)) {
            PyObject *type_name = PyType_GetName(Py_TYPE(keys));
            if (type_name != NULL) {
                PyErr_Format(PyExc_TypeError, "keys must be a list, a tuple or None, not %U",
                             type_name);
                Py_DECREF(type_name);
            }
            return NULL;
        }
        if (PySequence_Fast_GET_SIZE(keys) != n) {
            PyErr_Format(PyExc_ValueError, "%zd keys for %zd values",
                         PySequence_Fast_GET_SIZE(keys), n);
            return NULL;
        }
    }
    if (enter(self) < 0) {
        return NULL;
    }
    /* No Python code runs in this loop (no headers), so the sequences cannot change under it. */
    for (i = 0; i < n; i++) {
        rc = encode_record(self, timestamp,
                           keys == Py_None ? Py_None : PySequence_Fast_GET_ITEM(keys, i),
                           PySequence_Fast_GET_ITEM(values, i), Py_None);
        if (rc <= 0) {
            break;
        }
    }
    self->busy = 0;
    if (rc < 0) {
        return NULL;
    }
    return PyLong_FromSsize_t(i);
}

static PyObject *
RecordsBuilder_records(RecordsBuilder *self, PyObject *Py_UNUSED(ignored))
{
    return PyBytes_FromStringAndSize((const char *)self->buf, self->len);
}

static PyObject *
RecordsBuilder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"batch_size", NULL};
    PyObject *size_obj, *size;
    RecordsBuilder *self;
    long long batch_size;
    int overflow;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:RecordsBuilder", kwlist, &size_obj)) {
        return NULL;
    }
    size = PyNumber_Index(size_obj);
    if (size == NULL) {
        return NULL;
    }
    batch_size = PyLong_AsLongLongAndOverflow(size, &overflow);
    Py_DECREF(size);
    if (batch_size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow) {
        batch_size = overflow > 0 ? LLONG_MAX : LLONG_MIN;
    }
    self = (RecordsBuilder *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->batch_size = batch_size;
    return (PyObject *)self;
}

static void
RecordsBuilder_dealloc(RecordsBuilder *self)
{
    PyMem_Free(self->buf);
    Py_XDECREF(self->future_type);
    Py_XDECREF(self->result);
    Py_XDECREF(self->counter);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
RecordsBuilder_get_count(RecordsBuilder *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong((long)self->count);
}

static PyObject *
RecordsBuilder_get_size(RecordsBuilder *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(HEADER_SIZE + self->len);
}

static PyObject *
RecordsBuilder_get_base_timestamp(RecordsBuilder *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong((long long)self->base_timestamp);
}

static PyObject *
RecordsBuilder_get_max_timestamp(RecordsBuilder *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong((long long)self->max_timestamp);
}

static PyObject *
RecordsBuilder_get_batch_size(RecordsBuilder *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->batch_size);
}

static PyObject *
RecordsBuilder_get_last_record_size(RecordsBuilder *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->last_record_size);
}

static PyMethodDef RecordsBuilder_methods[] = {
    {"append", (PyCFunction)(void (*)(void))RecordsBuilder_append, METH_FASTCALL,
     "append($self, timestamp_ms, key, value, headers=None, /)\n--\n\n"
     "Encode one record; its index (offset delta), or -1 when it would take the batch past\n"
     "batch_size (nothing is added then; an empty builder takes any one record)."},
    {"append_values", (PyCFunction)(void (*)(void))RecordsBuilder_append_values, METH_FASTCALL,
     "append_values($self, timestamp_ms, values, keys=None, /)\n--\n\n"
     "Append values (a list or tuple) with one timestamp, no headers and the same-length keys\n"
     "(or null keys), from the front until one does not fit; returns how many were appended."},
    {"append_future", (PyCFunction)(void (*)(void))RecordsBuilder_append_future, METH_FASTCALL,
     "append_future($self, timestamp_ms, key, value, headers=None, /)\n--\n\n"
     "append for the producer: the record's future_type((result, index, timestamp_ms)), or None\n"
     "when it does not fit. Needs bind()."},
    {"bind", (PyCFunction)(void (*)(void))RecordsBuilder_bind, METH_FASTCALL,
     "bind($self, future_type, result, counter, /)\n--\n\n"
     "Give a new builder append_future's tuple type and the batch's result, and a ByteCount\n"
     "(or None) that every committed record's size is added to (61 more with the first)."},
    {"records", (PyCFunction)RecordsBuilder_records, METH_NOARGS,
     "records($self, /)\n--\n\nThe encoded records section (uncompressed), as bytes."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef RecordsBuilder_getset[] = {
    {"count", (getter)RecordsBuilder_get_count, NULL, "Records appended.", NULL},
    {"size", (getter)RecordsBuilder_get_size, NULL,
     "HEADER_SIZE plus the records' bytes: the uncompressed batch size.", NULL},
    {"base_timestamp", (getter)RecordsBuilder_get_base_timestamp, NULL,
     "The first record's timestamp (0 while empty).", NULL},
    {"max_timestamp", (getter)RecordsBuilder_get_max_timestamp, NULL,
     "The largest record timestamp (0 while empty).", NULL},
    {"batch_size", (getter)RecordsBuilder_get_batch_size, NULL,
     "The size limit append keeps to (clamped to the int64 range).", NULL},
    {"last_record_size", (getter)RecordsBuilder_get_last_record_size, NULL,
     "Bytes the last appended record took (0 while empty).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RecordsBuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "minibroker.client.records._encoder.RecordsBuilder",
    .tp_basicsize = sizeof(RecordsBuilder),
    .tp_dealloc = (destructor)RecordsBuilder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RecordsBuilder(batch_size)\n--\n\n"
              "The records section of one v2 batch, encoded as records are appended.",
    .tp_methods = RecordsBuilder_methods,
    .tp_getset = RecordsBuilder_getset,
    .tp_new = RecordsBuilder_new,
};

/* ---------------------------------------------------------------------------------------------
   Kafka's Utils.murmur2 (seed 0x9747b28c), the hash its default partitioner places keyed records
   with: the same signed 32-bit result as partitioner.murmur2_pure. */

static PyObject *
encoder_murmur2(PyObject *Py_UNUSED(module), PyObject *arg)
{
    const uint32_t m = 0x5bd1e995;
    Py_buffer view;
    const unsigned char *data;
    Py_ssize_t length, i, tail;
    uint32_t h, k;

    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "murmur2() needs bytes, not %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    data = (const unsigned char *)view.buf;
    length = view.len;
    h = 0x9747b28cU ^ (uint32_t)length;
    for (i = 0; i + 4 <= length; i += 4) {
        k = (uint32_t)data[i] | ((uint32_t)data[i + 1] << 8) | ((uint32_t)data[i + 2] << 16)
            | ((uint32_t)data[i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    tail = length & ~(Py_ssize_t)3;
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)data[tail + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[tail + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)data[tail];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    PyBuffer_Release(&view);
    return PyLong_FromLong((long)(int32_t)h);
}

static PyMethodDef encoder_functions[] = {
    {"murmur2", (PyCFunction)encoder_murmur2, METH_O,
     "murmur2($module, data, /)\n--\n\nKafka's Utils.murmur2 of bytes: a signed 32-bit int."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef encoder_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "minibroker.client.records._encoder",
    .m_doc = "The producer's per-record v2 encoding, compiled (see builder.BatchBuilder).",
    .m_size = -1,
    .m_methods = encoder_functions,
};

PyMODINIT_FUNC
PyInit__encoder(void)
{
    PyObject *module;

    if (PyType_Ready(&RecordsBuilderType) < 0 || PyType_Ready(&ByteCountType) < 0) {
        return NULL;
    }
    module = PyModule_Create(&encoder_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "HEADER_SIZE", HEADER_SIZE) < 0
        || PyModule_AddObjectRef(module, "RecordsBuilder", (PyObject *)&RecordsBuilderType) < 0
        || PyModule_AddObjectRef(module, "ByteCount", (PyObject *)&ByteCountType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
