/*
 * Compiled loops of `kvtool analyze`: the passes over every row that numpy can only do as a dozen full-array
 * steps.  Each function is a plain loop over arrays handed in by kvtool/events/kernels.py, which checks their
 * types and sizes; results go into arrays allocated there.  The GIL is released while a loop runs, so the
 * per-request pass and the physical-block pass run on two cores at once.
 *
 * The numpy versions (kvtool/events/analysis.py, blocks.py, segments.py) are the reference: the definitions are
 * written there, and tests/events/test_kernels.py checks that both give the same figures.  Built as an optional
 * extension: where it cannot be compiled, kvtool runs the numpy versions.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------- buffers */

typedef struct {
    Py_buffer view;
    int held;
} Buf;

/* A C-contiguous buffer of `count` items of `itemsize` bytes (count < 0: any count); None -> empty when allowed. */
static int get_buf(PyObject *obj, Buf *b, Py_ssize_t itemsize, Py_ssize_t count, int writable, int none_ok,
                   const char *name) {
    b->held = 0;
    if (obj == Py_None) {
        if (none_ok) return 0;
        PyErr_Format(PyExc_TypeError, "%s: an array is required", name);
        return -1;
    }
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    b->held = 1;
    if (b->view.itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected, got %zd", name, itemsize, b->view.itemsize);
        return -1;
    }
    if (count >= 0 && b->view.len / itemsize != count) {
        PyErr_Format(PyExc_ValueError, "%s: %zd items expected, got %zd", name, count, b->view.len / itemsize);
        return -1;
    }
    return 0;
}

static void release(Buf *bufs, int n) {
    for (int i = 0; i < n; i++)
        if (bufs[i].held) PyBuffer_Release(&bufs[i].view);
}

#define PTR(b, type) ((b).held ? (type *)(b).view.buf : (type *)NULL)
#define COUNT(b, size) ((b).held ? (b).view.len / (size) : 0)
/* Item i of an Arrow offsets buffer of 4-byte (string, list) or 8-byte (large_string, large_list) offsets. */
static inline int64_t offset_at(const void *offsets, Py_ssize_t size, Py_ssize_t i) {
    return size == 4 ? ((const int32_t *)offsets)[i] : ((const int64_t *)offsets)[i];
}

/* An Arrow offsets buffer of 4- or 8-byte items covering slots offset .. offset + length (length + 1 items). */
static int get_offsets(PyObject *obj, Buf *b, Py_ssize_t offset, Py_ssize_t length) {
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    b->held = 1;
    Py_ssize_t size = b->view.itemsize;
    if ((size != 4 && size != 8) || offset < 0 || length < 0 || b->view.len / size < offset + length + 1) {
        PyErr_SetString(PyExc_ValueError, "offsets: offset + length + 1 items of 4 or 8 bytes expected");
        return -1;
    }
    return 0;
}

/* The data bytes and the validity bitmap (None: no nulls) of an Arrow string array's slots offset .. + length. */
static int get_text(PyObject *data, PyObject *validity, Buf *b, Py_ssize_t offset, Py_ssize_t length) {
    if (get_buf(data, &b[0], 1, -1, 0, 0, "data") < 0 || get_buf(validity, &b[1], 1, -1, 0, 1, "validity") < 0)
        return -1;
    if (b[1].held && b[1].view.len * 8 < offset + length) {
        PyErr_SetString(PyExc_ValueError, "validity: too short");
        return -1;
    }
    return 0;
}

#define MARK(bits, k) ((bits)[(k) >> 3] |= (uint8_t)(1u << ((k) & 7)))

/* ------------------------------------------------------------------------------------- counting sort */

/* counting_argsort(keys: int64[m], n_keys, perm: int64[m] | None, out: int64[m]) -> None
 *
 * A stable argsort of keys in [0, n_keys): out lists the indices of keys in key order, equal keys in the order
 * of perm (file order when perm is None).  Two passes: a histogram, then each index to its key's next slot. */
static PyObject *counting_argsort(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o_keys, *o_perm, *o_out;
    Py_ssize_t n_keys;
    if (!PyArg_ParseTuple(args, "OnOO", &o_keys, &n_keys, &o_perm, &o_out)) return NULL;
    Buf b[3];
    memset(b, 0, sizeof b);
    if (get_buf(o_keys, &b[0], 8, -1, 0, 0, "keys") < 0) goto fail;
    Py_ssize_t m = COUNT(b[0], 8);
    if (get_buf(o_perm, &b[1], 8, m, 0, 1, "perm") < 0) goto fail;
    if (get_buf(o_out, &b[2], 8, m, 1, 0, "out") < 0) goto fail;
    if (n_keys < 0) {
        PyErr_SetString(PyExc_ValueError, "n_keys must be >= 0");
        goto fail;
    }
    const int64_t *keys = PTR(b[0], int64_t), *perm = PTR(b[1], int64_t);
    int64_t *out = PTR(b[2], int64_t);
    int64_t *slot = calloc((size_t)n_keys + 1, sizeof(int64_t));
    if (!slot) {
        PyErr_NoMemory();
        goto fail;
    }
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t k = keys[i];
        if (k < 0 || k >= n_keys) {
            bad = 1;
            break;
        }
        slot[k + 1]++;
    }
    if (!bad) {
        for (Py_ssize_t k = 0; k < n_keys; k++) slot[k + 1] += slot[k];
        for (Py_ssize_t i = 0; i < m; i++) {
            int64_t idx = perm ? perm[i] : i;
            if (idx < 0 || idx >= m) {
                bad = 2;
                break;
            }
            out[slot[keys[idx]]++] = idx;
        }
    }
    Py_END_ALLOW_THREADS;
    free(slot);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, bad == 1 ? "a key is outside [0, n_keys)" : "perm holds an index out of range");
        goto fail;
    }
    release(b, 3);
    Py_RETURN_NONE;
fail:
    release(b, 3);
    return NULL;
}

/* ------------------------------------------------------------------------------------ per-request pass */

/* request_sweep(ts f8[n], event i1[n], request i4[n], num_blocks i4[n], num_tokens i4[n], block_size i8[n] | None,
 *               default_block_size, time_order i8[n] | None, t_end, free_code, n_req,
 *               per request (n_req each): holding_s f8, block_seconds f8, slot_seconds f8, token_seconds f8,
 *               peak_tokens i8, peak_blocks i8, tokens i8, leaked_blocks i8, rises i8, over_frees i8, events i8,
 *               first_ts f8, last_ts f8, first_block_size i8, second_rise i8,
 *               db_ts (i4 or i8)[n], close_tpos i8[cap], close_req i8[cap])
 *   -> (closes, over_free_rows, over_freed_blocks)
 *
 * One sweep over the rows in time order (analysis.py's definitions, there computed in (request, ts) order).
 * Each request's blocks held b follow b = max(0, b + change), a free row's change being -num_blocks; the tokens
 * held restart where b was 0 before the row and are capped at b x block_size; the values after a row hold until
 * the request's next row (its last row's until t_end), which is when they are integrated.  db_ts is the change
 * of b at each time-order position; a close is a row that brings b back to 0 (in time order). */
static PyObject *request_sweep(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o[31];
    Py_ssize_t default_bs, n_req;
    double t_end;
    int free_code;
    if (!PyArg_ParseTuple(args, "OOOOOOnOdinOOOOOOOOOOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &default_bs, &o[6], &t_end, &free_code, &n_req, &o[7], &o[8], &o[9], &o[10], &o[11],
                          &o[12], &o[13], &o[14], &o[15], &o[16], &o[17], &o[18], &o[19], &o[20], &o[21], &o[22],
                          &o[23], &o[24]))
        return NULL;
    enum { NB = 25 };
    Buf b[NB];
    memset(b, 0, sizeof b);
    if (get_buf(o[0], &b[0], 8, -1, 0, 0, "ts") < 0) goto fail;
    Py_ssize_t n = COUNT(b[0], 8);
    if (get_buf(o[1], &b[1], 1, n, 0, 0, "event") < 0 || get_buf(o[2], &b[2], 4, n, 0, 0, "request") < 0 ||
        get_buf(o[3], &b[3], 4, n, 0, 0, "num_blocks") < 0 || get_buf(o[4], &b[4], 4, n, 0, 0, "num_tokens") < 0 ||
        get_buf(o[5], &b[5], 8, n, 0, 1, "block_size") < 0 || get_buf(o[6], &b[6], 8, n, 0, 1, "time_order") < 0)
        goto fail;
    static const char *req_names[] = {"holding_s",   "block_seconds", "slot_seconds", "token_seconds",
                                      "peak_tokens", "peak_blocks",   "tokens",       "leaked_blocks",
                                      "rises",       "over_frees",    "events",       "first_ts",
                                      "last_ts",     "first_block_size", "second_rise"};
    for (int i = 0; i < 15; i++)
        if (get_buf(o[7 + i], &b[7 + i], 8, n_req, 1, 0, req_names[i]) < 0) goto fail;
    if (PyObject_GetBuffer(o[22], &b[22].view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto fail;
    b[22].held = 1;
    Py_ssize_t db_size = b[22].view.itemsize;
    if ((db_size != 4 && db_size != 8) || b[22].view.len / db_size != n) {
        PyErr_SetString(PyExc_ValueError, "db_ts: n items of 4 or 8 bytes expected");
        goto fail;
    }
    if (get_buf(o[23], &b[23], 8, -1, 1, 0, "close_tpos") < 0) goto fail;
    Py_ssize_t cap = COUNT(b[23], 8);
    if (get_buf(o[24], &b[24], 8, cap, 1, 0, "close_req") < 0) goto fail;

    const double *ts = PTR(b[0], double);
    const int8_t *ev = PTR(b[1], int8_t);
    const int32_t *req = PTR(b[2], int32_t), *nb = PTR(b[3], int32_t), *nt = PTR(b[4], int32_t);
    const int64_t *bs_row = PTR(b[5], int64_t), *p0 = PTR(b[6], int64_t);
    double *holding = PTR(b[7], double), *block_s = PTR(b[8], double), *slot_s = PTR(b[9], double),
           *token_s = PTR(b[10], double);
    int64_t *peak_tok = PTR(b[11], int64_t), *peak_b = PTR(b[12], int64_t), *tokens = PTR(b[13], int64_t),
            *leaked = PTR(b[14], int64_t), *rises = PTR(b[15], int64_t), *over = PTR(b[16], int64_t),
            *events = PTR(b[17], int64_t);
    double *first_ts = PTR(b[18], double), *last_ts = PTR(b[19], double);
    int64_t *first_bs = PTR(b[20], int64_t), *second_rise = PTR(b[21], int64_t);
    void *db_ts = b[22].view.buf;
    int64_t *close_tpos = PTR(b[23], int64_t), *close_req = PTR(b[24], int64_t);

    /* per-request state, one record a request (two cache lines: a row touches one record, not 15 arrays); the
     * figures are copied out to the per-request arrays at the end */
    typedef struct {
        double last_ts, block_s, slot_s, token_s, holding;
        int64_t cur_b, cur_ht, cur_bs, cum_tok, tokens, peak_b, peak_tok, events, rises, over;
    } Req;
    Req *st = calloc((size_t)n_req + 1, sizeof(Req));
    if (!st) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t r = 0; r < n_req; r++) {
        first_ts[r] = 0.0;
        first_bs[r] = default_bs;
        second_rise[r] = n;
    }
    Py_ssize_t closes = 0;
    int64_t over_rows = 0, over_blocks = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t row = p0 ? (Py_ssize_t)p0[k] : k;
        int64_t r = req[row];
        if (r < 0 || r >= n_req || row < 0 || row >= n) {
            bad = 1;
            break;
        }
        Req *q = &st[r];
        double t = ts[row];
        int64_t bs = bs_row ? bs_row[row] : default_bs;
        if (q->events) { /* the previous row's values held until now */
            double dt = t - q->last_ts;
            q->block_s += (double)q->cur_b * dt;
            if (bs_row) q->slot_s += (double)(q->cur_b * q->cur_bs) * dt;
            q->token_s += (double)q->cur_ht * dt;
            if (q->cur_b > 0) q->holding += dt;
        } else {
            first_ts[r] = t;
            first_bs[r] = bs;
        }
        q->events++;
        int is_free = ev[row] == free_code;
        int64_t bp = q->cur_b;
        int64_t d = is_free ? -(int64_t)nb[row] : (int64_t)nb[row];
        int64_t tok = is_free ? 0 : (int64_t)nt[row];
        int64_t s = bp + d, bnew = s;
        if (d < 0 && s < 0) { /* a free of more than is held: clamped at 0 */
            q->over++;
            over_rows++;
            over_blocks += -s;
            bnew = 0;
        }
        if (bp == 0) q->cum_tok = 0; /* a new holding interval */
        q->cum_tok += tok;
        q->tokens += tok;
        int64_t cap_tok = bnew * bs;
        int64_t ht = q->cum_tok < cap_tok ? q->cum_tok : cap_tok;
        if (bp == 0 && bnew > 0 && ++q->rises == 2) second_rise[r] = k;
        if (bp > 0 && bnew == 0) {
            if (closes >= cap) {
                bad = 2;
                break;
            }
            close_tpos[closes] = k;
            close_req[closes] = r;
            closes++;
        }
        if (db_size == 4)
            ((int32_t *)db_ts)[k] = (int32_t)(bnew - bp);
        else
            ((int64_t *)db_ts)[k] = bnew - bp;
        if (bnew > q->peak_b) q->peak_b = bnew;
        if (ht > q->peak_tok) q->peak_tok = ht;
        q->cur_b = bnew;
        q->cur_ht = ht;
        q->cur_bs = bs;
        q->last_ts = t;
    }
    if (!bad) {
        for (Py_ssize_t r = 0; r < n_req; r++) {
            Req *q = &st[r];
            if (q->events) {
                double dt = t_end - q->last_ts;
                q->block_s += (double)q->cur_b * dt;
                if (bs_row) q->slot_s += (double)(q->cur_b * q->cur_bs) * dt;
                q->token_s += (double)q->cur_ht * dt;
                if (q->cur_b > 0) q->holding += dt;
                if (!bs_row) q->slot_s = q->block_s * (double)default_bs;
            }
            holding[r] = q->holding, block_s[r] = q->block_s, slot_s[r] = q->slot_s, token_s[r] = q->token_s;
            peak_tok[r] = q->peak_tok, peak_b[r] = q->peak_b, tokens[r] = q->tokens;
            leaked[r] = q->events ? q->cur_b : 0;
            rises[r] = q->rises, over[r] = q->over, events[r] = q->events;
            last_ts[r] = q->last_ts;
        }
    }
    Py_END_ALLOW_THREADS;
    free(st);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, bad == 1 ? "a request code or time order position is out of range"
                                                   : "more closes than close_tpos holds");
        goto fail;
    }
    release(b, NB);
    return Py_BuildValue("nLL", closes, (long long)over_rows, (long long)over_blocks);
fail:
    release(b, NB);
    return NULL;
}

/* pool_curves(db_ts (i4 or i8)[n], long_request u1[n_req], request i4[n_rows], time_order i8[n] | None, t_ts f8[n],
 *             in_use i8[n] | None, curve_t f8[n], curve_b i8[n], curve_long i8[n]) -> points
 *
 * The blocks in use (all, and long requests') summed over the changes in time order, as step curves: a point at
 * the last row of the first time and of each time whose rows change something, keeping the values after that
 * row, and only where a value differs from the point before.  in_use (when given) gets the blocks in use after
 * every row. */
static PyObject *pool_curves(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o[9];
    if (!PyArg_ParseTuple(args, "OOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8]))
        return NULL;
    Buf b[9];
    memset(b, 0, sizeof b);
    if (PyObject_GetBuffer(o[0], &b[0].view, PyBUF_C_CONTIGUOUS) < 0) goto fail;
    b[0].held = 1;
    Py_ssize_t dsize = b[0].view.itemsize, n = b[0].view.len / (dsize ? dsize : 1);
    if (dsize != 4 && dsize != 8) {
        PyErr_SetString(PyExc_ValueError, "db_ts: items of 4 or 8 bytes expected");
        goto fail;
    }
    if (get_buf(o[1], &b[1], 1, -1, 0, 0, "long_request") < 0 || get_buf(o[2], &b[2], 4, -1, 0, 0, "request") < 0 ||
        get_buf(o[3], &b[3], 8, n, 0, 1, "time_order") < 0 || get_buf(o[4], &b[4], 8, n, 0, 0, "t_ts") < 0 ||
        get_buf(o[5], &b[5], 8, n, 1, 1, "in_use") < 0 || get_buf(o[6], &b[6], 8, n, 1, 0, "curve_t") < 0 ||
        get_buf(o[7], &b[7], 8, n, 1, 0, "curve_b") < 0 || get_buf(o[8], &b[8], 8, n, 1, 0, "curve_long") < 0)
        goto fail;
    if (!b[3].held && COUNT(b[2], 4) != n) {
        PyErr_SetString(PyExc_ValueError, "request: n items expected");
        goto fail;
    }
    const void *db = b[0].view.buf;
    const uint8_t *long_req = PTR(b[1], uint8_t);
    const int32_t *request = PTR(b[2], int32_t);
    const int64_t *p0 = PTR(b[3], int64_t);
    const double *t_ts = PTR(b[4], double);
    int64_t *in_use_out = PTR(b[5], int64_t), *curve_b = PTR(b[7], int64_t), *curve_long = PTR(b[8], int64_t);
    double *curve_t = PTR(b[6], double);
    Py_ssize_t n_req = COUNT(b[1], 1), n_rows = COUNT(b[2], 4), points = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    int64_t in_use = 0, long_in_use = 0, last_b = 0, last_long = 0;
    int moved = 0, first = 1;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t d = dsize == 4 ? ((const int32_t *)db)[k] : ((const int64_t *)db)[k];
        if (d) {
            Py_ssize_t row = p0 ? (Py_ssize_t)p0[k] : k;
            if (row < 0 || row >= n_rows || request[row] < 0 || request[row] >= n_req) {
                bad = 1;
                break;
            }
            in_use += d;
            if (long_req[request[row]]) long_in_use += d;
            moved = 1;
        }
        if (in_use_out) in_use_out[k] = in_use;
        if (k + 1 == n || t_ts[k + 1] != t_ts[k]) { /* the last row of a time */
            if (first || (moved && (in_use != last_b || long_in_use != last_long))) {
                curve_t[points] = t_ts[k];
                curve_b[points] = in_use;
                curve_long[points] = long_in_use;
                points++;
                last_b = in_use, last_long = long_in_use;
            }
            first = 0, moved = 0;
        }
    }
    Py_END_ALLOW_THREADS;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "a row or request code is out of range");
        goto fail;
    }
    release(b, 9);
    return PyLong_FromSsize_t(points);
fail:
    release(b, 9);
    return NULL;
}

/* ------------------------------------------------------------------------------------ physical blocks */

/* group_attaches(rows i8[m], ids i8[m], event i1[n], request i4[n], free_code, max_id,
 *                a_ids i8[m], a_req i8[m], a_tpos i8[m], free_tpos i8[m]) -> (attaches, frees)
 *
 * The block-id listings of a file in time order (rows ascending, every row's time-order position its row):
 * the attach listings (allocate/append/reuse rows) grouped by id, each id's in time order (a counting sort by
 * id), with their request and position; and the positions of the free listings, in order. */
static PyObject *group_attaches(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o[8];
    int free_code;
    Py_ssize_t max_id;
    if (!PyArg_ParseTuple(args, "OOOOinOOOO", &o[0], &o[1], &o[2], &o[3], &free_code, &max_id, &o[4], &o[5], &o[6],
                          &o[7]))
        return NULL;
    Buf b[8];
    memset(b, 0, sizeof b);
    if (get_buf(o[0], &b[0], 8, -1, 0, 0, "rows") < 0) goto fail;
    Py_ssize_t m = COUNT(b[0], 8);
    if (get_buf(o[1], &b[1], 8, m, 0, 0, "ids") < 0 || get_buf(o[2], &b[2], 1, -1, 0, 0, "event") < 0) goto fail;
    Py_ssize_t n = COUNT(b[2], 1);
    if (get_buf(o[3], &b[3], 4, n, 0, 0, "request") < 0 || get_buf(o[4], &b[4], 8, m, 1, 0, "a_ids") < 0 ||
        get_buf(o[5], &b[5], 8, m, 1, 0, "a_req") < 0 || get_buf(o[6], &b[6], 8, m, 1, 0, "a_tpos") < 0 ||
        get_buf(o[7], &b[7], 8, m, 1, 0, "free_tpos") < 0)
        goto fail;
    if (max_id < 0) {
        PyErr_SetString(PyExc_ValueError, "max_id must be >= 0");
        goto fail;
    }
    const int64_t *rows = PTR(b[0], int64_t), *ids = PTR(b[1], int64_t);
    const int8_t *event = PTR(b[2], int8_t);
    const int32_t *request = PTR(b[3], int32_t);
    int64_t *a_ids = PTR(b[4], int64_t), *a_req = PTR(b[5], int64_t), *a_tpos = PTR(b[6], int64_t),
            *free_tpos = PTR(b[7], int64_t);
    int64_t *slot = calloc((size_t)max_id + 2, sizeof(int64_t));
    if (!slot) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t attaches = 0, frees = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t r = rows[i], id = ids[i];
        if (r < 0 || r >= n || id < 0 || id > max_id || (i && r < rows[i - 1])) {
            bad = 1;
            break;
        }
        if (event[r] != free_code) slot[id + 1]++;
    }
    if (!bad) {
        for (Py_ssize_t k = 0; k <= max_id; k++) slot[k + 1] += slot[k];
        attaches = slot[max_id + 1];
        for (Py_ssize_t i = 0; i < m; i++) {
            int64_t r = rows[i];
            if (event[r] == free_code) {
                free_tpos[frees++] = r;
            } else {
                int64_t at = slot[ids[i]]++;
                a_ids[at] = ids[i];
                a_req[at] = request[r];
                a_tpos[at] = r;
            }
        }
    }
    Py_END_ALLOW_THREADS;
    free(slot);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "a listing's row or id is out of range, or the rows are not ascending");
        goto fail;
    }
    release(b, 8);
    return Py_BuildValue("nn", attaches, frees);
fail:
    release(b, 8);
    return NULL;
}

/* close_releases(a_req i8[m], a_tpos i8[m], close_tpos i8[c], close_start i8[n_req + 1], n, out_rel i8[m]) -> None
 *
 * For each attach listing, the first close of its request strictly after it (close_tpos grouped by request, each
 * group in time order, close_start[r]..close_start[r+1] being request r's); n where there is none. */
static PyObject *close_releases(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o[5];
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOOOnO", &o[0], &o[1], &o[2], &o[3], &n, &o[4])) return NULL;
    Buf b[5];
    memset(b, 0, sizeof b);
    if (get_buf(o[0], &b[0], 8, -1, 0, 0, "a_req") < 0) goto fail;
    Py_ssize_t m = COUNT(b[0], 8);
    if (get_buf(o[1], &b[1], 8, m, 0, 0, "a_tpos") < 0 || get_buf(o[2], &b[2], 8, -1, 0, 0, "close_tpos") < 0 ||
        get_buf(o[3], &b[3], 8, -1, 0, 0, "close_start") < 0 || get_buf(o[4], &b[4], 8, m, 1, 0, "out_rel") < 0)
        goto fail;
    const int64_t *a_req = PTR(b[0], int64_t), *a_tpos = PTR(b[1], int64_t), *cpos = PTR(b[2], int64_t),
                  *cstart = PTR(b[3], int64_t);
    int64_t *rel = PTR(b[4], int64_t);
    Py_ssize_t n_starts = COUNT(b[3], 8), n_close = COUNT(b[2], 8);
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t r = a_req[i];
        if (r < 0 || r + 1 >= n_starts || cstart[r] < 0 || cstart[r + 1] > n_close) {
            bad = 1;
            break;
        }
        int64_t lo = cstart[r], hi = cstart[r + 1], t = a_tpos[i];
        while (lo < hi) { /* first close position > t */
            int64_t mid = lo + (hi - lo) / 2;
            if (cpos[mid] > t)
                hi = mid;
            else
                lo = mid + 1;
        }
        rel[i] = lo < cstart[r + 1] ? cpos[lo] : n;
    }
    Py_END_ALLOW_THREADS;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "a request code is outside close_start");
        goto fail;
    }
    release(b, 5);
    Py_RETURN_NONE;
fail:
    release(b, 5);
    return NULL;
}

/* union_curve(a_ids i8[m], a_tpos i8[m], rel i8[m], t_ts f8[n], point_pos i8[p], point_in_use i8[p],
 *             turnover f8[m]) -> (points, turnovers)
 *
 * Attach listings grouped by id, each id's in time order, each held over [a_tpos, rel) (rel == n: to the end of
 * the trace; a hold whose release has the attach's ts changes nothing).  An id is in use while any of its holds
 * covers the time: each part of that union is a rise (0 -> 1) and, unless it runs to the end, a fall (1 -> 0);
 * at one position a fall comes before a rise.  The gap from a fall to the id's next rise is a turnover time.
 * The curve has a point at each distinct ts with a transition: the last position of that ts and the ids in use
 * after it (p = min(n, 2m) holds them all). */
static PyObject *union_curve(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o[7];
    if (!PyArg_ParseTuple(args, "OOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6])) return NULL;
    Buf b[7];
    memset(b, 0, sizeof b);
    if (get_buf(o[0], &b[0], 8, -1, 0, 0, "a_ids") < 0) goto fail;
    Py_ssize_t m = COUNT(b[0], 8);
    if (get_buf(o[1], &b[1], 8, m, 0, 0, "a_tpos") < 0 || get_buf(o[2], &b[2], 8, m, 0, 0, "rel") < 0 ||
        get_buf(o[3], &b[3], 8, -1, 0, 0, "t_ts") < 0)
        goto fail;
    Py_ssize_t n = COUNT(b[3], 8);
    Py_ssize_t most = n < 2 * m ? n : 2 * m;
    if (get_buf(o[4], &b[4], 8, most, 1, 0, "point_pos") < 0 ||
        get_buf(o[5], &b[5], 8, most, 1, 0, "point_in_use") < 0 || get_buf(o[6], &b[6], 8, m, 1, 0, "turnover") < 0)
        goto fail;
    const int64_t *ids = PTR(b[0], int64_t), *tpos = PTR(b[1], int64_t), *rel = PTR(b[2], int64_t);
    const double *t_ts = PTR(b[3], double);
    int64_t *point_pos = PTR(b[4], int64_t), *point_in_use = PTR(b[5], int64_t);
    double *turnover = PTR(b[6], double);
    int32_t *delta = calloc((size_t)n + 1, sizeof(int32_t)); /* net transitions at each position */
    uint8_t *moved = calloc((size_t)n / 8 + 1, 1);            /* a bit: a transition happened at the position */
    if (!delta || !moved) {
        free(delta), free(moved);
        PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t turnovers = 0, points = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    Py_ssize_t i = 0;
    while (i < m && !bad) { /* one id at a time */
        int64_t id = ids[i];
        int open = 0;
        int64_t start = 0, reach = 0, prev_fall = -1; /* keys: 2 x position (+1 for a rise) */
        for (; i < m && ids[i] == id; i++) {
            int64_t a = tpos[i], r = rel[i];
            if (a < 0 || a >= n || r <= a || r > n) {
                bad = 1;
                break;
            }
            if (r < n && !(t_ts[r] > t_ts[a])) continue; /* released at its attach's ts: no hold */
            int64_t s = 2 * a + 1;
            if (open && s > reach) { /* the hold starts after the part so far has ended: close it */
                delta[start >> 1]++, MARK(moved, start >> 1);
                delta[reach >> 1]--, MARK(moved, reach >> 1);
                prev_fall = reach;
                open = 0;
            }
            if (!open) {
                if (prev_fall >= 0) turnover[turnovers++] = t_ts[a] - t_ts[prev_fall >> 1];
                start = s, reach = 2 * r, open = 1;
            } else if (2 * r > reach) {
                reach = 2 * r;
            }
        }
        if (open && !bad) {
            delta[start >> 1]++, MARK(moved, start >> 1);
            if (reach < 2 * n) delta[reach >> 1]--, MARK(moved, reach >> 1);
        }
    }
    if (!bad) {
        int64_t in_use = 0;
        int run_moved = 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            in_use += delta[k];
            run_moved |= (moved[k >> 3] >> (k & 7)) & 1;
            if (k + 1 == n || t_ts[k + 1] != t_ts[k]) { /* the last position of a distinct ts */
                if (run_moved) {
                    point_pos[points] = k;
                    point_in_use[points] = in_use;
                    points++;
                }
                run_moved = 0;
            }
        }
    }
    Py_END_ALLOW_THREADS;
    free(delta), free(moved);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "a hold is outside the trace or released before it starts");
        goto fail;
    }
    release(b, 7);
    return Py_BuildValue("nn", points, turnovers);
fail:
    release(b, 7);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ block ids */

/* parse_block_ids(offsets (i4 or i8)[offset + length + 1], data u1[...], validity u1[...] | None, offset, length,
 *                 row_base, out_rows i8[cap] | None, out_ids i8[cap] | None, out_bad i8[cap_bad] | None)
 *   -> (ids, bad_rows)
 *
 * One Arrow string array (its buffers, `offset` being the array's slot offset): each valid value is block ids
 * separated by spaces; empty tokens (doubled or padding spaces) are skipped; a token that is not 1 to 18 ASCII
 * digits makes its row unparseable: the row's ids are dropped and the row (row_base + slot) listed in out_bad.
 * With the outputs None it only counts.  A value of L bytes holds at most (L + 1) / 2 ids. */
static PyObject *parse_block_ids(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o[6];
    Py_ssize_t offset, length, row_base;
    if (!PyArg_ParseTuple(args, "OOOnnnOOO", &o[0], &o[1], &o[2], &offset, &length, &row_base, &o[3], &o[4], &o[5]))
        return NULL;
    Buf b[6];
    memset(b, 0, sizeof b);
    if (get_offsets(o[0], &b[0], offset, length) < 0 || get_text(o[1], o[2], &b[1], offset, length) < 0 ||
        get_buf(o[3], &b[3], 8, -1, 1, 1, "out_rows") < 0 || get_buf(o[4], &b[4], 8, -1, 1, 1, "out_ids") < 0 ||
        get_buf(o[5], &b[5], 8, -1, 1, 1, "out_bad") < 0)
        goto fail;
    Py_ssize_t osize = b[0].view.itemsize;
    const uint8_t *data = PTR(b[1], uint8_t), *valid = PTR(b[2], uint8_t);
    Py_ssize_t data_len = b[1].view.len;
    int64_t *out_rows = PTR(b[3], int64_t), *out_ids = PTR(b[4], int64_t), *out_bad = PTR(b[5], int64_t);
    Py_ssize_t cap = out_rows ? COUNT(b[3], 8) : 0;
    if (out_ids && COUNT(b[4], 8) != cap) {
        PyErr_SetString(PyExc_ValueError, "out_rows and out_ids differ in size");
        goto fail;
    }
    Py_ssize_t bad_cap = COUNT(b[5], 8);
    const void *offs = b[0].view.buf;
    Py_ssize_t ids = 0, bad_rows = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < length; i++) {
        Py_ssize_t slot = offset + i;
        if (valid && !((valid[slot >> 3] >> (slot & 7)) & 1)) continue; /* null: no ids */
        int64_t lo = offset_at(offs, osize, slot), hi = offset_at(offs, osize, slot + 1);
        if (lo < 0 || hi < lo || hi > data_len) {
            bad = 1;
            break;
        }
        Py_ssize_t first = ids; /* the row's ids are written as they parse, and taken back if a token is bad */
        int ok = 1;
        int64_t value = 0, digits = 0;
        for (int64_t p = lo; p <= hi; p++) {
            if (p == hi || data[p] == ' ') { /* the end of a token (none where digits == 0: an empty one) */
                if (digits) {
                    if (out_rows) {
                        if (ids >= cap) {
                            bad = 2;
                            break;
                        }
                        out_rows[ids] = row_base + i;
                        out_ids[ids] = value;
                    }
                    ids++;
                }
                value = 0, digits = 0;
            } else {
                unsigned d = (unsigned)data[p] - '0';
                if (d > 9 || ++digits > 18) {
                    ok = 0;
                    break;
                }
                value = value * 10 + d;
            }
        }
        if (bad) break;
        if (!ok) {
            ids = first;
            if (out_bad) {
                if (bad_rows >= bad_cap) {
                    bad = 3;
                    break;
                }
                out_bad[bad_rows] = row_base + i;
            }
            bad_rows++;
        }
    }
    Py_END_ALLOW_THREADS;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, bad == 1   ? "offsets outside the data"
                                          : bad == 2 ? "more ids than out_rows holds"
                                                     : "more unparseable rows than out_bad holds");
        goto fail;
    }
    release(b, 6);
    return Py_BuildValue("nn", ids, bad_rows);
fail:
    release(b, 6);
    return NULL;
}

/* list_block_ids(offsets (i4 or i8)[offset + length + 1], values i8[...], values_validity u1[...] | None,
 *                list_validity u1[...] | None, offset, length, row_base, out_rows i8[cap], out_ids i8[cap],
 *                out_bad i8[cap_bad]) -> (ids, bad_rows)
 *
 * One Arrow list<int64> array (Parquet's block ids): each valid list's values are the row's ids; a null or
 * negative value makes the row unparseable (its ids dropped, the row listed in out_bad).  `values` is the
 * child array's value buffer from its first slot, `values_validity` its validity bitmap (bits from values_bit). */
static PyObject *list_block_ids(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o[7];
    Py_ssize_t offset, length, row_base, values_bit;
    if (!PyArg_ParseTuple(args, "OOOnOnnnOOO", &o[0], &o[1], &o[2], &values_bit, &o[3], &offset, &length, &row_base,
                          &o[4], &o[5], &o[6]))
        return NULL;
    Buf b[7];
    memset(b, 0, sizeof b);
    if (get_offsets(o[0], &b[0], offset, length) < 0) goto fail;
    if (values_bit < 0) {
        PyErr_SetString(PyExc_ValueError, "values_bit: a bit index expected");
        goto fail;
    }
    Py_ssize_t osize = b[0].view.itemsize;
    if (get_buf(o[1], &b[1], 8, -1, 0, 0, "values") < 0 || get_buf(o[2], &b[2], 1, -1, 0, 1, "values_validity") < 0 ||
        get_buf(o[3], &b[3], 1, -1, 0, 1, "list_validity") < 0 || get_buf(o[4], &b[4], 8, -1, 1, 0, "out_rows") < 0 ||
        get_buf(o[5], &b[5], 8, -1, 1, 0, "out_ids") < 0 || get_buf(o[6], &b[6], 8, -1, 1, 0, "out_bad") < 0)
        goto fail;
    const int64_t *values = PTR(b[1], int64_t);
    const uint8_t *vvalid = PTR(b[2], uint8_t), *lvalid = PTR(b[3], uint8_t);
    Py_ssize_t n_values = COUNT(b[1], 8), vbits = b[2].held ? b[2].view.len * 8 : 0;
    Py_ssize_t lbits = b[3].held ? b[3].view.len * 8 : 0;
    int64_t *out_rows = PTR(b[4], int64_t), *out_ids = PTR(b[5], int64_t), *out_bad = PTR(b[6], int64_t);
    Py_ssize_t cap = COUNT(b[4], 8), bad_cap = COUNT(b[6], 8);
    if (COUNT(b[5], 8) != cap || (lvalid && lbits < offset + length)) {
        PyErr_SetString(PyExc_ValueError, "out_rows and out_ids differ in size, or list_validity is too short");
        goto fail;
    }
    const void *offs = b[0].view.buf;
    Py_ssize_t ids = 0, bad_rows = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < length && !bad; i++) {
        Py_ssize_t slot = offset + i;
        if (lvalid && !((lvalid[slot >> 3] >> (slot & 7)) & 1)) continue; /* a null list: no ids */
        int64_t lo = offset_at(offs, osize, slot), hi = offset_at(offs, osize, slot + 1);
        if (lo < 0 || hi < lo || hi > n_values || (vvalid && values_bit + hi > vbits)) {
            bad = 1;
            break;
        }
        int ok = 1;
        for (int64_t k = lo; k < hi; k++) {
            int64_t bit = values_bit + k;
            if ((vvalid && !((vvalid[bit >> 3] >> (bit & 7)) & 1)) || values[k] < 0) {
                ok = 0;
                break;
            }
        }
        if (!ok) {
            if (bad_rows >= bad_cap) {
                bad = 3;
                break;
            }
            out_bad[bad_rows++] = row_base + i;
            continue;
        }
        if (ids + (hi - lo) > cap) {
            bad = 2;
            break;
        }
        for (int64_t k = lo; k < hi; k++) {
            out_rows[ids] = row_base + i;
            out_ids[ids++] = values[k];
        }
    }
    Py_END_ALLOW_THREADS;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, bad == 1   ? "list offsets outside the values"
                                          : bad == 2 ? "more ids than out_rows holds"
                                                     : "more unparseable rows than out_bad holds");
        goto fail;
    }
    release(b, 7);
    return Py_BuildValue("nn", ids, bad_rows);
fail:
    release(b, 7);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ event names */

/* The first min(n, 8) bytes of a value as a word, the bytes beyond it zero (one 8-byte load where the buffer has
 * room for it on a little-endian machine, else byte by byte). */
static inline uint64_t head_word(const uint8_t *p, int64_t n, const uint8_t *end) {
    if (n > 8) n = 8;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        return n == 8 ? w : w & ((1ULL << (8 * n)) - 1);
    }
#endif
    uint64_t w = 0;
    for (int64_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
    return w;
}

#define MAX_NAMES 8

/* event_codes(offsets (i4 or i8)[offset + length + 1], data u1[...], validity u1[...] | None, offset, length,
 *             names: (bytes, ...), codes i1[length]) -> rows marked other
 *
 * One Arrow string array of event names matched against the names as written: a row's code is the index of the
 * name its value equals byte for byte, -2 for a null or empty value, and -3 for any other value (another case,
 * spaces, an unknown type, invalid UTF-8), which the caller resolves by the full rules on those rows' distinct
 * values. */
static PyObject *event_codes(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o[3], *names, *o_codes;
    Py_ssize_t offset, length;
    if (!PyArg_ParseTuple(args, "OOOnnO!O", &o[0], &o[1], &o[2], &offset, &length, &PyTuple_Type, &names, &o_codes))
        return NULL;
    Py_ssize_t n_names = PyTuple_GET_SIZE(names);
    if (n_names > MAX_NAMES) {
        PyErr_SetString(PyExc_ValueError, "names: at most 8");
        return NULL;
    }
    const uint8_t *name_ptr[MAX_NAMES];
    int64_t name_len[MAX_NAMES];
    uint64_t name_head[MAX_NAMES];
    signed char by_len[64]; /* the name of each length below 64: its index, -1 none, -2 several */
    memset(by_len, -1, sizeof by_len);
    for (Py_ssize_t i = 0; i < n_names; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyBytes_Check(name) || PyBytes_GET_SIZE(name) == 0) {
            PyErr_SetString(PyExc_TypeError, "names: non-empty bytes expected");
            return NULL;
        }
        name_ptr[i] = (const uint8_t *)PyBytes_AS_STRING(name);
        name_len[i] = PyBytes_GET_SIZE(name);
        name_head[i] = head_word(name_ptr[i], name_len[i], name_ptr[i] + name_len[i]);
        if (name_len[i] < 64) by_len[name_len[i]] = by_len[name_len[i]] == -1 ? (signed char)i : -2;
    }
    Buf b[4];
    memset(b, 0, sizeof b);
    if (get_offsets(o[0], &b[0], offset, length) < 0 || get_text(o[1], o[2], &b[1], offset, length) < 0 ||
        get_buf(o_codes, &b[3], 1, length, 1, 0, "codes") < 0)
        goto fail;
    Py_ssize_t osize = b[0].view.itemsize;
    const void *offs = b[0].view.buf;
    const uint8_t *data = PTR(b[1], uint8_t), *valid = PTR(b[2], uint8_t);
    Py_ssize_t data_len = b[1].view.len, other = 0;
    int8_t *codes = PTR(b[3], int8_t);
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < length; i++) {
        Py_ssize_t slot = offset + i;
        if (valid && !((valid[slot >> 3] >> (slot & 7)) & 1)) {
            codes[i] = -2;
            continue;
        }
        int64_t lo = offset_at(offs, osize, slot), hi = offset_at(offs, osize, slot + 1);
        if (lo < 0 || hi < lo || hi > data_len) {
            bad = 1;
            break;
        }
        int64_t n = hi - lo;
        if (n == 0) {
            codes[i] = -2;
            continue;
        }
        uint64_t head = head_word(data + lo, n, data + data_len);
        int8_t code = -3;
        int k = n < 64 ? by_len[n] : -2;
        if (k >= 0) { /* the one name of this length */
            if (name_head[k] == head && (n <= 8 || memcmp(name_ptr[k] + 8, data + lo + 8, (size_t)(n - 8)) == 0))
                code = (int8_t)k;
        } else if (k == -2) { /* several names of this length, or a long value */
            for (k = 0; k < n_names; k++) {
                if (name_len[k] == n && name_head[k] == head &&
                    (n <= 8 || memcmp(name_ptr[k] + 8, data + lo + 8, (size_t)(n - 8)) == 0)) {
                    code = (int8_t)k;
                    break;
                }
            }
        }
        codes[i] = code;
        other += code == -3;
    }
    Py_END_ALLOW_THREADS;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "offsets outside the data");
        goto fail;
    }
    release(b, 4);
    return PyLong_FromSsize_t(other);
fail:
    release(b, 4);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"counting_argsort", counting_argsort, METH_VARARGS, "Stable argsort of small non-negative integer keys."},
    {"request_sweep", request_sweep, METH_VARARGS, "The per-request pass over the rows in time order."},
    {"pool_curves", pool_curves, METH_VARARGS, "Blocks in use over time as step curves."},
    {"group_attaches", group_attaches, METH_VARARGS, "Attach listings grouped by id, in time order."},
    {"close_releases", close_releases, METH_VARARGS, "The close of its request that releases each attach."},
    {"union_curve", union_curve, METH_VARARGS, "Physical blocks in use: the union of each id's holds."},
    {"parse_block_ids", parse_block_ids, METH_VARARGS, "Space-separated block ids of a string array."},
    {"list_block_ids", list_block_ids, METH_VARARGS, "Block ids of a list<int64> array (Parquet)."},
    {"event_codes", event_codes, METH_VARARGS, "Event names of a string column matched as written."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels", "Compiled loops of kvtool analyze.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
