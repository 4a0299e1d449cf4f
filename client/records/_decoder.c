/* minibroker.client.records._decoder: the v2 records-section decoder in C.
 *
 * Pure: no I/O. The compiled twin of decode.py's `parse_records` (the reference, and the
 * fallback when this module is not built; with MINIBROKER_PURE_CODEC=1 in the environment its
 * import fails, so decode.py uses the pure loop): the same records from the
 * same (already decompressed, already CRC-checked) records section, and for malformed input the
 * same reason, raised as `RecordsError(reason)`; decode.py adds the batch's position and raises
 * CorruptRecordError. Every rule below mirrors a line of decode.py, including where the pure
 * code reads one byte ahead (a record's length and valueLength) and so reports "truncated"
 * when that byte is missing.
 *
 *   parse_records(data, count, base_offset, base_timestamp, append_time, make, prefix, suffix)
 *
 * builds one record per record: when `make` is a tuple subclass (a NamedTuple such as
 * DecodedRecord or the consumer's Record) an instance of it holding
 * prefix + (offset, timestamp, key, value, headers) + suffix, built directly as
 * tuple.__new__ would (the class's __new__ is not called); otherwise make(offset, timestamp,
 * key, value, headers), with prefix and suffix empty.
 *
 *   parse_columns(data, count, base_offset, base_timestamp, append_time, with_headers)
 *
 * the same records as columns: (offsets, timestamps, keys, values, headers) lists (headers None
 * unless `with_headers`), for building Arrow arrays without a Python object per record.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static PyObject *RecordsError;

#define MIN_RECORD_BODY_BYTES 6
#define MIN_RECORD_BYTES 7

/* Results of the varint readers: the pure code's IndexError and VarintTooLong. */
enum { V_OK = 0, V_TRUNCATED = 1, V_TOO_LONG = 2 };

/* read_varint_unchecked: at most 5 bytes, keeps the low 32 bits of the groups (as Java). */
static inline int
read_varint(const unsigned char *d, Py_ssize_t end, Py_ssize_t *pos, int32_t *out)
{
    Py_ssize_t p = *pos;
    if (p >= end)
        return V_TRUNCATED;
    uint32_t b = d[p++];
    if (b < 0x80) {
        *out = (int32_t)((b >> 1) ^ (0u - (b & 1)));
        *pos = p;
        return V_OK;
    }
    uint64_t result = b & 0x7F;
    int shift = 7;
    for (;;) {
        if (p >= end)
            return V_TRUNCATED;
        b = d[p++];
        result |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80)
            break;
        shift += 7;
        if (shift > 28)
            return V_TOO_LONG;
    }
    uint32_t r = (uint32_t)result;
    *out = (int32_t)((r >> 1) ^ (0u - (r & 1)));
    *pos = p;
    return V_OK;
}

/* read_varlong_unchecked: at most 10 bytes, low 64 bits. */
static inline int
read_varlong(const unsigned char *d, Py_ssize_t end, Py_ssize_t *pos, int64_t *out)
{
    Py_ssize_t p = *pos;
    if (p >= end)
        return V_TRUNCATED;
    uint64_t b = d[p++];
    if (b < 0x80) {
        *out = (int64_t)((b >> 1) ^ (0u - (b & 1)));
        *pos = p;
        return V_OK;
    }
    uint64_t result = b & 0x7F;
    int shift = 7;
    for (;;) {
        if (p >= end)
            return V_TRUNCATED;
        b = d[p++];
        result |= (b & 0x7F) << shift;
        if (b < 0x80)
            break;
        shift += 7;
        if (shift > 63)
            return V_TOO_LONG;
    }
    *out = (int64_t)((result >> 1) ^ (0ull - (result & 1)));
    *pos = p;
    return V_OK;
}

/* Raise RecordsError(reason); returns NULL for `return fail(...)`. */
static PyObject *
fail(const char *format, ...)
{
    va_list vargs;
    va_start(vargs, format);
    PyObject *reason = PyUnicode_FromFormatV(format, vargs);
    va_end(vargs);
    if (reason != NULL) {
        PyErr_SetObject(RecordsError, reason);
        Py_DECREF(reason);
    }
    return NULL;
}

/* A varint reader's failure as the pure code words it (IndexError / VarintTooLong). */
static PyObject *
fail_varint(int status, Py_ssize_t i, int is_long)
{
    if (status == V_TRUNCATED)
        return fail("record %zd is truncated", i);
    return fail(is_long ? "record %zd: varlong is longer than 10 bytes"
                        : "record %zd: varint is longer than 5 bytes",
                i);
}

/* base + delta as a Python int; Python's ints do not overflow, so neither may this. */
static PyObject *
add_int64(int64_t base, int64_t delta, PyObject *base_obj)
{
    int64_t sum;
    if (!__builtin_add_overflow(base, delta, &sum))
        return PyLong_FromLongLong(sum);
    PyObject *d = PyLong_FromLongLong(delta);
    if (d == NULL)
        return NULL;
    PyObject *r = PyNumber_Add(base_obj, d);
    Py_DECREF(d);
    return r;
}

/* The fields of one record, as parsed. */
typedef struct {
    PyObject *offset, *timestamp, *key, *value, *headers;
} fields;

static void
fields_clear(fields *f)
{
    Py_CLEAR(f->offset);
    Py_CLEAR(f->timestamp);
    Py_CLEAR(f->key);
    Py_CLEAR(f->value);
    Py_CLEAR(f->headers);
}

typedef struct {
    const unsigned char *d;
    Py_ssize_t end;
    int64_t base_offset, base_timestamp;
    PyObject *base_offset_obj, *base_timestamp_obj, *append_time; /* borrowed */
    int with_headers;
} batch_ctx;

/* parse_headers: `count` headers from *pos, within the record ending at record_end. */
static PyObject *
parse_headers(const batch_ctx *c, Py_ssize_t *pos, Py_ssize_t record_end, int32_t count,
              Py_ssize_t i)
{
    const unsigned char *d = c->d;
    Py_ssize_t p = *pos;
    if (count < 0 || (int64_t)count * 2 > (int64_t)record_end - (int64_t)p)
        return fail("record %zd headersCount %d", i, (int)count);
    PyObject *headers = PyTuple_New(count);
    if (headers == NULL)
        return NULL;
    for (int32_t h = 0; h < count; h++) {
        int32_t name_length, value_length;
        int st = read_varint(d, c->end, &p, &name_length);
        if (st != V_OK) {
            fail_varint(st, i, 0);
            goto error;
        }
        if (name_length < 0) {
            fail("record %zd has a null header key", i);
            goto error;
        }
        if ((int64_t)p + name_length > (int64_t)record_end) {
            fail("record %zd header key overruns the record", i);
            goto error;
        }
        PyObject *name = PyUnicode_DecodeUTF8((const char *)d + p, name_length, NULL);
        if (name == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                goto error;
            PyErr_Clear();
            fail("record %zd header key is not UTF-8", i);
            goto error;
        }
        p += name_length;
        st = read_varint(d, c->end, &p, &value_length);
        if (st != V_OK) {
            Py_DECREF(name);
            fail_varint(st, i, 0);
            goto error;
        }
        PyObject *value;
        if (value_length < 0) {
            if (value_length != -1) {
                Py_DECREF(name);
                fail("record %zd header value length %d", i, (int)value_length);
                goto error;
            }
            value = Py_NewRef(Py_None);
        }
        else {
            if ((int64_t)p + value_length > (int64_t)record_end) {
                Py_DECREF(name);
                fail("record %zd header value overruns the record", i);
                goto error;
            }
            value = PyBytes_FromStringAndSize((const char *)d + p, value_length);
            if (value == NULL) {
                Py_DECREF(name);
                goto error;
            }
            p += value_length;
        }
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_DECREF(name);
            Py_DECREF(value);
            goto error;
        }
        PyTuple_SET_ITEM(pair, 0, name);
        PyTuple_SET_ITEM(pair, 1, value);
        PyTuple_SET_ITEM(headers, h, pair);
    }
    *pos = p;
    return headers;
error:
    Py_DECREF(headers);
    return NULL;
}

/* One record from *pos (record index i); fills `out` (new references), advances *pos.
 * Returns 0, or -1 with an exception set. */
static int
parse_one(const batch_ctx *c, Py_ssize_t *pos, Py_ssize_t i, int32_t count, fields *out)
{
    const unsigned char *d = c->d;
    const Py_ssize_t end = c->end;
    Py_ssize_t p = *pos;
    int32_t length, offset_delta, key_length, value_length;
    int64_t timestamp_delta;
    int st;

    if (p >= end) {
        fail("recordsCount %d but the records section ends after %zd records", (int)count, i);
        return -1;
    }
    /* The pure code reads data[pos + 1] before decoding the length. */
    if (p + 1 >= end) {
        fail("record %zd is truncated", i);
        return -1;
    }
    if ((st = read_varint(d, end, &p, &length)) != V_OK) {
        fail_varint(st, i, 0);
        return -1;
    }
    Py_ssize_t record_end = p + length;
    if (length < MIN_RECORD_BODY_BYTES || record_end > end) {
        fail("record %zd declares %d bytes, %zd left", i, (int)length, end - p);
        return -1;
    }
    p += 1; /* attributes: unused in v2 records */
    if ((st = read_varlong(d, end, &p, &timestamp_delta)) != V_OK) {
        fail_varint(st, i, 1);
        return -1;
    }
    if ((st = read_varint(d, end, &p, &offset_delta)) != V_OK) {
        fail_varint(st, i, 0);
        return -1;
    }
    if ((st = read_varint(d, end, &p, &key_length)) != V_OK) {
        fail_varint(st, i, 0);
        return -1;
    }
    if (key_length < 0) {
        if (key_length != -1) {
            fail("record %zd key length %d", i, (int)key_length);
            return -1;
        }
        out->key = Py_NewRef(Py_None);
    }
    else {
        if (p + key_length > record_end) {
            fail("record %zd key overruns the record", i);
            return -1;
        }
        out->key = PyBytes_FromStringAndSize((const char *)d + p, key_length);
        if (out->key == NULL)
            return -1;
        p += key_length;
    }
    /* The pure code reads data[pos + 1] before decoding valueLength. */
    if (p + 1 >= end) {
        fail("record %zd is truncated", i);
        return -1;
    }
    if ((st = read_varint(d, end, &p, &value_length)) != V_OK) {
        fail_varint(st, i, 0);
        return -1;
    }
    if (value_length < 0) {
        if (value_length != -1) {
            fail("record %zd value length %d", i, (int)value_length);
            return -1;
        }
        out->value = Py_NewRef(Py_None);
    }
    else {
        if (p + value_length > record_end) {
            fail("record %zd value overruns the record", i);
            return -1;
        }
        out->value = PyBytes_FromStringAndSize((const char *)d + p, value_length);
        if (out->value == NULL)
            return -1;
        p += value_length;
    }
    if (p >= end) {
        fail("record %zd is truncated", i);
        return -1;
    }
    if (d[p] == 0) {
        p += 1;
        if (c->with_headers)
            out->headers = PyTuple_New(0);
    }
    else {
        int32_t header_count;
        if ((st = read_varint(d, end, &p, &header_count)) != V_OK) {
            fail_varint(st, i, 0);
            return -1;
        }
        out->headers = parse_headers(c, &p, record_end, header_count, i);
        if (out->headers == NULL)
            return -1;
        if (!c->with_headers)
            Py_CLEAR(out->headers);
    }
    if (c->with_headers && out->headers == NULL)
        return -1;
    if (p != record_end) {
        fail("record %zd declares %d bytes but its fields take %zd", i, (int)length,
             (Py_ssize_t)length + p - record_end);
        return -1;
    }
    out->offset = add_int64(c->base_offset, offset_delta, c->base_offset_obj);
    if (out->offset == NULL)
        return -1;
    if (c->append_time != Py_None)
        out->timestamp = Py_NewRef(c->append_time);
    else
        out->timestamp = add_int64(c->base_timestamp, timestamp_delta, c->base_timestamp_obj);
    if (out->timestamp == NULL)
        return -1;
    *pos = p;
    return 0;
}

/* The arguments both entry points share: data, count, base_offset, base_timestamp,
 * append_time. */
static int
parse_common(PyObject *const *args, batch_ctx *c, Py_ssize_t *count_out)
{
    PyObject *data = args[0];
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "data must be bytes");
        return -1;
    }
    long long count = PyLong_AsLongLong(args[1]);
    if (count == -1 && PyErr_Occurred())
        return -1;
    c->base_offset = PyLong_AsLongLong(args[2]);
    if (c->base_offset == -1 && PyErr_Occurred())
        return -1;
    c->base_timestamp = PyLong_AsLongLong(args[3]);
    if (c->base_timestamp == -1 && PyErr_Occurred())
        return -1;
    c->base_offset_obj = args[2];
    c->base_timestamp_obj = args[3];
    c->append_time = args[4];
    c->d = (const unsigned char *)PyBytes_AS_STRING(data);
    c->end = PyBytes_GET_SIZE(data);
    if (count < INT32_MIN || count > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "count is outside int32");
        return -1;
    }
    if (count * MIN_RECORD_BYTES > (long long)c->end) {
        fail("recordsCount %d cannot fit in %zd bytes of records", (int)count, c->end);
        return -1;
    }
    *count_out = count < 0 ? 0 : (Py_ssize_t)count;
    return 0;
}

static PyObject *
fail_trailing(Py_ssize_t left, long long count)
{
    return fail("%zd bytes left after the %lld declared records", left, count);
}

static PyObject *
parse_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "parse_records takes 8 arguments");
        return NULL;
    }
    batch_ctx c;
    Py_ssize_t count;
    if (parse_common(args, &c, &count) < 0)
        return NULL;
    c.with_headers = 1;
    long long declared = PyLong_AsLongLong(args[1]);
    PyObject *make = args[5], *prefix = args[6], *suffix = args[7];
    if (!PyTuple_Check(prefix) || !PyTuple_Check(suffix)) {
        PyErr_SetString(PyExc_TypeError, "prefix and suffix must be tuples");
        return NULL;
    }
    Py_ssize_t n_prefix = PyTuple_GET_SIZE(prefix), n_suffix = PyTuple_GET_SIZE(suffix);
    PyTypeObject *cls = NULL;
    if (PyType_Check(make) && PyType_IsSubtype((PyTypeObject *)make, &PyTuple_Type))
        cls = (PyTypeObject *)make;
    else if (n_prefix || n_suffix) {
        PyErr_SetString(PyExc_TypeError, "prefix and suffix need a tuple subclass as make");
        return NULL;
    }
    Py_ssize_t width = n_prefix + 5 + n_suffix;

    PyObject *records = PyList_New(count);
    if (records == NULL)
        return NULL;
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        fields f = {NULL, NULL, NULL, NULL, NULL};
        if (parse_one(&c, &pos, i, (int32_t)declared, &f) < 0) {
            fields_clear(&f);
            goto error;
        }
        PyObject *record;
        if (cls != NULL) {
            record = cls->tp_alloc(cls, width);
            if (record == NULL) {
                fields_clear(&f);
                goto error;
            }
            for (Py_ssize_t k = 0; k < n_prefix; k++)
                PyTuple_SET_ITEM(record, k, Py_NewRef(PyTuple_GET_ITEM(prefix, k)));
            /* the record takes over the fields' references */
            PyTuple_SET_ITEM(record, n_prefix + 0, f.offset);
            PyTuple_SET_ITEM(record, n_prefix + 1, f.timestamp);
            PyTuple_SET_ITEM(record, n_prefix + 2, f.key);
            PyTuple_SET_ITEM(record, n_prefix + 3, f.value);
            PyTuple_SET_ITEM(record, n_prefix + 4, f.headers);
            for (Py_ssize_t k = 0; k < n_suffix; k++)
                PyTuple_SET_ITEM(record, n_prefix + 5 + k, Py_NewRef(PyTuple_GET_ITEM(suffix, k)));
        }
        else {
            PyObject *call_args[5] = {f.offset, f.timestamp, f.key, f.value, f.headers};
            record = PyObject_Vectorcall(make, call_args, 5, NULL);
            fields_clear(&f);
            if (record == NULL)
                goto error;
        }
        PyList_SET_ITEM(records, i, record);
    }
    if (pos != c.end) {
        fail_trailing(c.end - pos, declared);
        goto error;
    }
    return records;
error:
    Py_DECREF(records);
    return NULL;
}

static PyObject *
parse_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "parse_columns takes 6 arguments");
        return NULL;
    }
    batch_ctx c;
    Py_ssize_t count;
    if (parse_common(args, &c, &count) < 0)
        return NULL;
    long long declared = PyLong_AsLongLong(args[1]);
    c.with_headers = PyObject_IsTrue(args[5]);
    if (c.with_headers < 0)
        return NULL;
    PyObject *offsets = PyList_New(count), *timestamps = PyList_New(count);
    PyObject *keys = PyList_New(count), *values = PyList_New(count);
    PyObject *headers = c.with_headers ? PyList_New(count) : Py_NewRef(Py_None);
    PyObject *result = NULL;
    if (!offsets || !timestamps || !keys || !values || !headers)
        goto done;
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        fields f = {NULL, NULL, NULL, NULL, NULL};
        if (parse_one(&c, &pos, i, (int32_t)declared, &f) < 0) {
            fields_clear(&f);
            goto done;
        }
        PyList_SET_ITEM(offsets, i, f.offset);
        PyList_SET_ITEM(timestamps, i, f.timestamp);
        PyList_SET_ITEM(keys, i, f.key);
        PyList_SET_ITEM(values, i, f.value);
        if (c.with_headers)
            PyList_SET_ITEM(headers, i, f.headers);
    }
    if (pos != c.end) {
        fail_trailing(c.end - pos, declared);
        goto done;
    }
    result = PyTuple_Pack(5, offsets, timestamps, keys, values, headers);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(timestamps);
    Py_XDECREF(keys);
    Py_XDECREF(values);
    Py_XDECREF(headers);
    return result;
}

static PyMethodDef methods[] = {
    {"parse_records", (PyCFunction)(void (*)(void))parse_records, METH_FASTCALL,
     "parse_records(data, count, base_offset, base_timestamp, append_time, make, prefix, "
     "suffix) -> list: the records of a records section (see the module docstring)."},
    {"parse_columns", (PyCFunction)(void (*)(void))parse_columns, METH_FASTCALL,
     "parse_columns(data, count, base_offset, base_timestamp, append_time, with_headers) -> "
     "(offsets, timestamps, keys, values, headers): the same records as column lists."},
    {NULL, NULL, 0, NULL},
};

static int
exec_module(PyObject *module)
{
    const char *pure = getenv("MINIBROKER_PURE_CODEC");
    if (pure != NULL && strcmp(pure, "1") == 0) {
        PyErr_SetString(PyExc_ImportError,
                        "MINIBROKER_PURE_CODEC=1: the pure Python decoder is used");
        return -1;
    }
    RecordsError = PyErr_NewExceptionWithDoc(
        "minibroker.client.records._decoder.RecordsError",
        "A malformed records section; args[0] is decode.py's reason for it.",
        PyExc_ValueError, NULL);
    if (RecordsError == NULL)
        return -1;
    if (PyModule_AddObjectRef(module, "RecordsError", RecordsError) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "minibroker.client.records._decoder",
    .m_doc = "The v2 records-section decoder in C (see decode.py, its pure reference).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC
PyInit__decoder(void)
{
    return PyModuleDef_Init(&module_def);
}
