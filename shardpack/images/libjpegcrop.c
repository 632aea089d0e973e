/* libjpegcrop: decode one rectangle of a JPEG at a DCT scale with the system libjpeg(-turbo).
 *
 * Why: a training crop is known before the image is decoded.  libjpeg-turbo can skip rows
 * (jpeg_skip_scanlines) and narrow every row to the crop's iMCU columns (jpeg_crop_scanline), so
 * the IDCT, upsampling and colour conversion run only on the crop.  Huffman decoding still runs
 * over the whole scan: the gain is the rest (docs/device.md, "Region decode").  No pip package
 * exposes this (simplejpeg and Pillow decode whole images), hence this small module.
 *
 * decode(data, scale_num, y0, y1, x0, x1, max_scans=100, max_memory=0)
 *     -> (pixels: bytearray, rows, cols, skew)
 *
 * The box [y0, y1) x [x0, x1) is in OUTPUT pixels of the image decoded at scale_num/8
 * (1, 2, 4, 8: the SIMD IDCTs); the caller computes it, so it rounds the same way its fallback
 * does.  pixels holds rows = y1 - y0 rows of cols RGB pixels; the box's first column is column
 * skew (jpeg_crop_scanline widens to iMCU boundaries).  The same pixels as a whole decode at that
 * scale, cropped: fast integer IDCT and plain upsampling, as simplejpeg's fastdct/fastupsample.
 *
 * Errors: ValueError (corrupt data; any libjpeg warning, which is corrupt data it would paper
 * over; more than max_scans scans; a box outside the image), NotImplementedError (CMYK/YCCK,
 * whose RGB the caller converts), MemoryError.  The GIL is released while libjpeg runs.
 *
 * decode_many(datas, jobs, out, max_scans=100, max_memory=0) -> bytes, one status per image
 *
 * The same for a batch, with the GIL released once for all of it (a loader of threads: one
 * release and re-acquire per call, not three per image).  datas: N bytes-like JPEGs; jobs: int64
 * [N, 6] of (scale_num, y0, y1, x0, x1, offset); out: a writable buffer where each box lands at
 * its byte offset as rows of exactly (x1 - x0) * 3 bytes (no skew).  Status 0: decoded; else the
 * box was declined (1 corrupt or refused, 2 CMYK/YCCK, 3 box outside the image, 5 no end-of-image
 * marker) and the caller decodes that image its own way; its bytes in out are then undefined.
 * A malformed job (bad scale, empty box, past the end of out) is a ValueError before any decode.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int max_scans;
    char message[JMSG_LENGTH_MAX];
} err_mgr;

static void on_error(j_common_ptr cinfo) {
    err_mgr *err = (err_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) {  /* a warning: corrupt data libjpeg would recover from; refuse it */
        err_mgr *err = (err_mgr *)cinfo->err;
        (*cinfo->err->format_message)(cinfo, err->message);
        longjmp(err->jump, 1);
    }
}

static void on_progress(j_common_ptr cinfo) {  /* as djpeg -maxscans: progressive scan bombs */
    err_mgr *err = (err_mgr *)cinfo->err;
    if (cinfo->is_decompressor && err->max_scans > 0 &&
        ((j_decompress_ptr)cinfo)->input_scan_number > err->max_scans) {
        snprintf(err->message, sizeof(err->message), "more than %d scans", err->max_scans);
        longjmp(err->jump, 1);
    }
}

enum { OK = 0, FAILED, COLOUR, BAD_BOX, NO_MEMORY, NO_EOI };

/* The box's geometry once decompression has started: rows of cols pixels, the box at column skew. */
typedef struct {
    JDIMENSION rows, cols, skew;
} geometry;

/* Read the header, check the box and start decompression up to the box's first row: everything
 * but the rows themselves, shared by decode and decode_many.  Runs without the GIL; a libjpeg error
 * longjmps to the caller's setjmp.  cinfo was zeroed and its err set by the caller. */
static int start_box(j_decompress_ptr cinfo, err_mgr *err, struct jpeg_progress_mgr *progress,
                     const unsigned char *data, unsigned long len, int scale_num,
                     unsigned long y0, unsigned long y1, unsigned long x0, unsigned long x1,
                     long max_memory, geometry *box) {
    jpeg_create_decompress(cinfo);
    progress->progress_monitor = on_progress;
    cinfo->progress = progress;
    if (max_memory > 0)
        cinfo->mem->max_memory_to_use = max_memory;
    jpeg_mem_src(cinfo, data, len);
    jpeg_read_header(cinfo, TRUE);
    if (cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK)
        return COLOUR;
    cinfo->out_color_space = JCS_RGB;
    cinfo->scale_num = (unsigned int)scale_num;
    cinfo->scale_denom = 8;
    cinfo->dct_method = JDCT_IFAST;
    cinfo->do_fancy_upsampling = FALSE;
    jpeg_calc_output_dimensions(cinfo);
    if (y1 > cinfo->output_height || x1 > cinfo->output_width)
        return BAD_BOX;
    jpeg_start_decompress(cinfo);
    /* A column of margin each side: fancy upsampling reads the neighbouring column.  Plain
     * upsampling (set above) does not, but the box must not depend on that setting. */
    JDIMENSION xoff = x0 > 0 ? (JDIMENSION)x0 - 1 : 0;
    JDIMENSION width = (x1 < cinfo->output_width ? (JDIMENSION)x1 + 1 : (JDIMENSION)x1) - xoff;
    if (xoff > 0 || width < cinfo->output_width)
        jpeg_crop_scanline(cinfo, &xoff, &width);  /* widens to iMCU columns */
    box->skew = (JDIMENSION)x0 - xoff;
    box->cols = cinfo->output_width;  /* the row width after jpeg_crop_scanline */
    box->rows = (JDIMENSION)(y1 - y0);
    if (box->skew + (x1 - x0) > box->cols)  /* cannot happen with a sane libjpeg: never overrun */
        return BAD_BOX;
    if (y0 > 0 && jpeg_skip_scanlines(cinfo, (JDIMENSION)y0) != (JDIMENSION)y0) {
        snprintf(err->message, sizeof(err->message), "too few rows");
        return FAILED;
    }
    return OK;
}

static PyObject *decode(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"data", "scale_num", "y0", "y1", "x0", "x1", "max_scans",
                             "max_memory", NULL};
    Py_buffer buf;
    int scale_num, max_scans = 100;
    unsigned long y0, y1, x0, x1;
    long max_memory = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*ikkkk|il", kwlist, &buf, &scale_num, &y0,
                                     &y1, &x0, &x1, &max_scans, &max_memory))
        return NULL;
    if (y1 <= y0 || x1 <= x0 || (scale_num != 1 && scale_num != 2 && scale_num != 4 &&
                                 scale_num != 8) || buf.len < 4) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "empty box, scale not 1, 2, 4 or 8, or no data");
        return NULL;
    }

    struct jpeg_decompress_struct cinfo;
    struct jpeg_progress_mgr progress;
    err_mgr err;
    geometry box;
    memset(&err, 0, sizeof(err));
    memset(&cinfo, 0, sizeof(cinfo));
    memset(&progress, 0, sizeof(progress));
    memset(&box, 0, sizeof(box));
    err.max_scans = max_scans;
    PyObject *volatile out = NULL;
    volatile int status = OK;
    PyThreadState *volatile save = PyEval_SaveThread();

    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    if (setjmp(err.jump)) {  /* every libjpeg error lands here, with the GIL released */
        status = FAILED;
        goto done;
    }
    status = start_box(&cinfo, &err, &progress, (const unsigned char *)buf.buf,
                       (unsigned long)buf.len, scale_num, y0, y1, x0, x1, max_memory, &box);
    if (status != OK)
        goto done;
    PyEval_RestoreThread(save);
    out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)box.rows * box.cols * 3);
    save = PyEval_SaveThread();
    if (out == NULL) {
        status = NO_MEMORY;
        goto done;
    }
    {
        unsigned char *base = (unsigned char *)PyByteArray_AS_STRING(out);
        size_t stride = (size_t)box.cols * 3;
        while (cinfo.output_scanline < y1) {
            JSAMPROW row = base + (size_t)(cinfo.output_scanline - y0) * stride;
            if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
                snprintf(err.message, sizeof(err.message), "too few rows");
                status = FAILED;
                goto done;
            }
        }
    }
done:
    /* cinfo was zeroed: safe even where jpeg_create_decompress failed part-way */
    jpeg_destroy_decompress(&cinfo);  /* the rows below the box are never decoded */
    PyEval_RestoreThread(save);
    PyBuffer_Release(&buf);
    if (status != OK) {
        Py_XDECREF(out);
        if (status == FAILED)
            PyErr_Format(PyExc_ValueError, "JPEG: %s", err.message);
        else if (status == COLOUR)
            PyErr_SetString(PyExc_NotImplementedError, "CMYK/YCCK JPEG");
        else if (status == BAD_BOX)
            PyErr_SetString(PyExc_ValueError, "box outside the image");
        else if (!PyErr_Occurred())
            PyErr_NoMemory();
        return NULL;
    }
    return Py_BuildValue("(NIII)", out, (unsigned)box.rows, (unsigned)box.cols,
                         (unsigned)box.skew);
}

/* One box of decode_many, without the GIL: its rows, exactly (x1 - x0) * 3 bytes each, at dest.
 * Each row is read into libjpeg's own row buffer (freed with cinfo) and its box copied out. */
static int decode_into(const unsigned char *data, unsigned long len, const long long *job,
                       int max_scans, long max_memory, unsigned char *dest) {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_progress_mgr progress;
    err_mgr err;
    geometry box;
    unsigned long y0 = (unsigned long)job[1], y1 = (unsigned long)job[2];
    unsigned long x0 = (unsigned long)job[3], x1 = (unsigned long)job[4];
    if (len < 4 || data[len - 2] != 0xFF || data[len - 1] != 0xD9)
        return NO_EOI;  /* truncated: damage below the box would go unseen; the caller judges */
    memset(&err, 0, sizeof(err));
    memset(&cinfo, 0, sizeof(cinfo));
    memset(&progress, 0, sizeof(progress));
    memset(&box, 0, sizeof(box));
    err.max_scans = max_scans;
    volatile int status = OK;
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    if (setjmp(err.jump)) {
        status = FAILED;
        goto done;
    }
    status = start_box(&cinfo, &err, &progress, data, len, (int)job[0], y0, y1, x0, x1,
                       max_memory, &box);
    if (status != OK)
        goto done;
    {
        JSAMPARRAY row = (*cinfo.mem->alloc_sarray)((j_common_ptr)&cinfo, JPOOL_IMAGE,
                                                    box.cols * 3, 1);
        size_t width = (size_t)(x1 - x0) * 3;
        while (cinfo.output_scanline < y1) {
            unsigned char *to = dest + (size_t)(cinfo.output_scanline - y0) * width;
            if (jpeg_read_scanlines(&cinfo, row, 1) != 1) {
                status = FAILED;
                goto done;
            }
            memcpy(to, row[0] + (size_t)box.skew * 3, width);
        }
    }
done:
    jpeg_destroy_decompress(&cinfo);
    return status;
}

/* Check decode_many's jobs against its data and out buffer (with the GIL): a bad job is the
 * caller's bug, a ValueError before anything is decoded. */
static int check_jobs(const long long *jobs, Py_ssize_t count, Py_ssize_t out_len) {
    for (Py_ssize_t i = 0; i < count; i++) {
        const long long *job = jobs + 6 * i;
        long long s = job[0], y0 = job[1], y1 = job[2], x0 = job[3], x1 = job[4], at = job[5];
        /* JPEG sides are below 65536: no product below can overflow */
        if ((s != 1 && s != 2 && s != 4 && s != 8) || y0 < 0 || x0 < 0 || y1 <= y0 ||
            x1 <= x0 || y1 > 65535 || x1 > 65535 || at < 0 ||
            at > (long long)out_len - (y1 - y0) * (x1 - x0) * 3) {
            PyErr_Format(PyExc_ValueError, "job %zd: scale not 1, 2, 4 or 8, an empty box, or "
                         "a box past the out buffer", i);
            return -1;
        }
    }
    return 0;
}

static PyObject *decode_many(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"datas", "jobs", "out", "max_scans", "max_memory", NULL};
    PyObject *datas, *seq = NULL, *result = NULL;
    Py_buffer jobs, out, *bufs = NULL;
    int max_scans = 100;
    long max_memory = 0;
    Py_ssize_t count = 0, held = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oy*w*|il", kwlist, &datas, &jobs, &out,
                                     &max_scans, &max_memory))
        return NULL;
    seq = PySequence_Fast(datas, "datas must be a sequence of bytes-like objects");
    if (seq == NULL)
        goto finally;
    count = PySequence_Fast_GET_SIZE(seq);
    if (jobs.len != count * 6 * (Py_ssize_t)sizeof(long long)) {
        PyErr_SetString(PyExc_ValueError, "jobs must be int64 [len(datas), 6]: scale_num, y0, "
                        "y1, x0, x1, offset");
        goto finally;
    }
    if (check_jobs((const long long *)jobs.buf, count, out.len) < 0)
        goto finally;
    result = PyBytes_FromStringAndSize(NULL, count);
    bufs = PyMem_Calloc(count ? count : 1, sizeof(Py_buffer));
    if (result == NULL || bufs == NULL) {
        Py_CLEAR(result);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto finally;
    }
    for (; held < count; held++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &bufs[held],
                               PyBUF_SIMPLE) < 0) {
            Py_CLEAR(result);
            goto finally;
        }
    {
        char *status = PyBytes_AS_STRING(result);
        const long long *job = (const long long *)jobs.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < count; i++, job += 6)
            status[i] = (char)decode_into((const unsigned char *)bufs[i].buf,
                                          (unsigned long)bufs[i].len, job, max_scans,
                                          max_memory, (unsigned char *)out.buf + job[5]);
        Py_END_ALLOW_THREADS
    }
finally:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
    Py_XDECREF(seq);
    PyBuffer_Release(&jobs);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *version(PyObject *self, PyObject *unused) {
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
    return PyLong_FromLong(LIBJPEG_TURBO_VERSION_NUMBER);
#else
    return PyLong_FromLong(JPEG_LIB_VERSION);
#endif
}

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))decode, METH_VARARGS | METH_KEYWORDS,
     "decode(data, scale_num, y0, y1, x0, x1, max_scans=100, max_memory=0) -> "
     "(rgb bytearray, rows, cols, skew): one box of a JPEG decoded at scale_num/8"},
    {"decode_many", (PyCFunction)(void (*)(void))decode_many, METH_VARARGS | METH_KEYWORDS,
     "decode_many(datas, jobs, out, max_scans=100, max_memory=0) -> bytes of statuses: "
     "many boxes decoded into one buffer, the GIL released once"},
    {"version", version, METH_NOARGS, "the libjpeg(-turbo) version compiled against"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "libjpegcrop",
                                    "One box of a JPEG, decoded at a DCT scale.", -1, methods};

PyMODINIT_FUNC PyInit_libjpegcrop(void) { return PyModule_Create(&module); }
