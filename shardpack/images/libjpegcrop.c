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

enum { OK = 0, FAILED, COLOUR, BAD_BOX, NO_MEMORY };

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
    memset(&err, 0, sizeof(err));
    memset(&cinfo, 0, sizeof(cinfo));
    memset(&progress, 0, sizeof(progress));
    err.max_scans = max_scans;
    PyObject *volatile out = NULL;
    volatile int status = OK;
    volatile JDIMENSION rows = 0, cols = 0, skew = 0;
    PyThreadState *volatile save = PyEval_SaveThread();

    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    if (setjmp(err.jump)) {  /* every libjpeg error lands here, with the GIL released */
        status = FAILED;
        goto done;
    }
    jpeg_create_decompress(&cinfo);
    progress.progress_monitor = on_progress;
    cinfo.progress = &progress;
    if (max_memory > 0)
        cinfo.mem->max_memory_to_use = max_memory;
    jpeg_mem_src(&cinfo, (const unsigned char *)buf.buf, (unsigned long)buf.len);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        status = COLOUR;
        goto done;
    }
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = (unsigned int)scale_num;
    cinfo.scale_denom = 8;
    cinfo.dct_method = JDCT_IFAST;
    cinfo.do_fancy_upsampling = FALSE;
    jpeg_calc_output_dimensions(&cinfo);
    if (y1 > cinfo.output_height || x1 > cinfo.output_width) {
        status = BAD_BOX;
        goto done;
    }
    jpeg_start_decompress(&cinfo);
    {
        /* A column of margin each side: fancy upsampling reads the neighbouring column.  Plain
         * upsampling (set above) does not, but the box must not depend on that setting. */
        JDIMENSION xoff = x0 > 0 ? (JDIMENSION)x0 - 1 : 0;
        JDIMENSION width = (x1 < cinfo.output_width ? (JDIMENSION)x1 + 1 : (JDIMENSION)x1) - xoff;
        if (xoff > 0 || width < cinfo.output_width)
            jpeg_crop_scanline(&cinfo, &xoff, &width);  /* widens to iMCU columns */
        skew = (JDIMENSION)x0 - xoff;
        cols = cinfo.output_width;  /* the row width after jpeg_crop_scanline */
        rows = (JDIMENSION)(y1 - y0);
        if (skew + (x1 - x0) > cols) {  /* cannot happen with a sane libjpeg: never overrun */
            status = BAD_BOX;
            goto done;
        }
        if (y0 > 0 && jpeg_skip_scanlines(&cinfo, (JDIMENSION)y0) != (JDIMENSION)y0) {
            snprintf(err.message, sizeof(err.message), "too few rows");
            status = FAILED;
            goto done;
        }
        PyEval_RestoreThread(save);
        out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)rows * cols * 3);
        save = PyEval_SaveThread();
        if (out == NULL) {
            status = NO_MEMORY;
            goto done;
        }
        unsigned char *base = (unsigned char *)PyByteArray_AS_STRING(out);
        size_t stride = (size_t)cols * 3;
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
    return Py_BuildValue("(NIII)", out, (unsigned)rows, (unsigned)cols, (unsigned)skew);
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
    {"version", version, METH_NOARGS, "the libjpeg(-turbo) version compiled against"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "libjpegcrop",
                                    "One box of a JPEG, decoded at a DCT scale.", -1, methods};

PyMODINIT_FUNC PyInit_libjpegcrop(void) { return PyModule_Create(&module); }
