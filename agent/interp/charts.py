# Chart JSON for matplotlib figures, loaded into every Python kernel by the
# bridge (bridge.py) as module forkbox_charts. figure_chart(fig) returns
# the figure's chart in the shape of E2B's chart objects (the
# @e2b/code-interpreter client's Chart types): a dict with "type" (line,
# scatter, bar, pie, box_and_whisker, superchart or unknown), "title",
# "elements" and, for charts with axes, "x_label", "y_label", "x_unit",
# "y_unit"; point charts add ticks, tick labels and scales. A figure with
# no data gives None (no chart).
import datetime
import math
import re

_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def _num(v):
    """A JSON-safe plain number or string for a matplotlib data value."""
    try:
        import numpy
        if isinstance(v, numpy.datetime64):
            return str(v.astype('datetime64[s]'))
        if isinstance(v, numpy.generic):
            v = v.item()
    except ImportError:
        pass
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, (int, float, str)) or v is None:
        return v
    return str(v)


def _round(v):
    """Rounds away float noise (box edges, wedge angles)."""
    v = float(v)
    if v == 0 or math.isnan(v) or math.isinf(v):
        return v
    return round(v, max(0, 6 - int(math.floor(math.log10(abs(v))))))


def _text(s):
    return s if s else None


def _axes_info(ax, out):
    out['x_label'] = _text(ax.get_xlabel())
    out['y_label'] = _text(ax.get_ylabel())
    for axis in ('x', 'y'):
        label = out[axis + '_label']
        m = _UNIT.search(label) if label else None
        out[axis + '_unit'] = (m.group(1) or m.group(2)) if m else None


def _swap_axes(out):
    for a, b in (('x_label', 'y_label'), ('x_unit', 'y_unit')):
        out[a], out[b] = out[b], out[a]


def _is_grid(line):
    xs, ys = list(line.get_xdata()), list(line.get_ydata())
    return len(xs) == 2 and len(ys) == 2 and (xs[0] == xs[1] or ys[0] == ys[1]) and line.get_label().startswith('_')


def _kind(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge
    from matplotlib.text import Text
    objs = [o for o in ax.get_children() if o in getattr(ax, '_children', [])]
    objs = [o for o in objs if not isinstance(o, Text)]
    if not objs:
        return 'unknown'
    if all(isinstance(o, Line2D) for o in objs):
        return 'line'
    if all(isinstance(o, (PathPatch, Line2D)) for o in objs):
        return 'box_and_whisker'
    objs = [o for o in objs if not (isinstance(o, Line2D) and _is_grid(o))]
    if objs and all(isinstance(o, PathCollection) for o in objs):
        return 'scatter'
    if objs and all(isinstance(o, Wedge) for o in objs):
        return 'pie'
    if objs and all(isinstance(o, Rectangle) for o in objs):
        return 'bar'
    return 'unknown'


def _ticks(ax, out):
    import matplotlib.dates as mdates
    for axis, obj in (('x', ax.xaxis), ('y', ax.yaxis)):
        ticks = list(getattr(ax, 'get_%sticks' % axis)())
        labels = [t.get_text() for t in getattr(ax, 'get_%sticklabels' % axis)()]
        conv = obj.get_converter() if hasattr(obj, 'get_converter') else obj.converter
        dates = conv is not None and 'Date' in type(conv).__name__
        if dates:
            ticks = [mdates.num2date(t).isoformat() for t in ticks]
            scale = 'datetime'
        else:
            ticks = [float(t) for t in ticks]
            scale = getattr(ax, 'get_%sscale' % axis)()
            if scale == 'linear' and ticks and all(t == i and str(i) != l for i, (t, l) in enumerate(zip(ticks, labels))):
                scale = 'categorical'
        out[axis + '_ticks'] = ticks
        out[axis + '_tick_labels'] = labels
        out[axis + '_scale'] = scale


def _points(xs, ys):
    return [[_num(x), _num(y)] for x, y in zip(xs, ys)]


def axes_chart(ax):
    """The chart of one matplotlib Axes (a dict)."""
    kind = _kind(ax)
    out = {'type': kind, 'title': _text(ax.get_title()), 'elements': []}
    if kind == 'pie':
        for w in ax.patches:
            out['elements'].append({'label': w.get_label(), 'angle': abs(_round(w.theta2 - w.theta1)),
                                    'radius': float(w.r)})
        return out
    if kind == 'unknown':
        return out
    _axes_info(ax, out)
    if kind == 'line':
        _ticks(ax, out)
        n = 0
        for line in ax.get_lines():
            if _is_grid(line):
                continue
            label = line.get_label()
            if label.startswith('_child'):
                label = 'Line %s' % label[6:]
            n += 1
            out['elements'].append({'label': label, 'points': _points(line.get_xdata(), line.get_ydata())})
    elif kind == 'scatter':
        _ticks(ax, out)
        for col in ax.collections:
            offs = col.get_offsets()
            out['elements'].append({'label': col.get_label(), 'points': _points(offs[:, 0], offs[:, 1])})
    elif kind == 'bar':
        swapped = False
        for cont in ax.containers:
            group = cont.get_label() or ''
            if group.startswith('_container'):
                group = 'Group %s' % group[10:]
            heights = [r.get_height() for r in cont]
            if heights and all(h == heights[0] for h in heights) and len(heights) > 1:
                # Horizontal bars: equal heights, the value is the width.
                if not swapped:
                    _swap_axes(out)
                    swapped = True
                labels = [t.get_text() for t in ax.get_yticklabels()]
                values = [r.get_width() for r in cont]
            else:
                labels = [t.get_text() for t in ax.get_xticklabels()]
                values = heights
            for label, value in zip(labels, values):
                out['elements'].append({'label': label, 'group': group, 'value': _num(value)})
    elif kind == 'box_and_whisker':
        out['elements'] = _boxes(ax, out)
    return out


def _boxes(ax, out):
    labels = [t.get_text() for t in ax.get_xticklabels()]
    boxes = []
    for label, patch in zip(labels, ax.patches):
        v = patch.get_path().vertices
        xs = [_round(x) for x in v[:, 0]]
        ys = [_round(y) for y in v[:, 1]]
        boxes.append({'label': label, 'x': min(xs), 'y': min(ys), 'w': max(xs) - min(xs),
                      'h': max(ys) - min(ys), 'outliers': []})
    vertical = bool(boxes) and all(b['h'] == boxes[0]['h'] for b in boxes) and len(boxes) > 1
    if vertical:
        _swap_axes(out)
        for b in boxes:
            b['x'], b['y'], b['w'], b['h'] = b['y'], b['x'], b['h'], b['w']
    for line in ax.lines:
        xs = [_round(x) for x in line.get_xdata()]
        ys = [_round(y) for y in line.get_ydata()]
        if vertical:
            xs, ys = ys, xs
        for b in boxes:
            if not xs or not (b['x'] <= xs[0] <= b['x'] + b['w']):
                continue
            if len(ys) == 1 or (len(ys) > 2 and len(set(xs)) == 1 and line.get_linestyle() == 'None'):
                b['outliers'].extend(ys)
            elif len(ys) == 2 and ys[0] == ys[1] and b['y'] <= ys[0] <= b['y'] + b['h']:
                b['median'] = ys[0]
            elif len(ys) == 2:
                lo, hi = min(ys), max(ys)
                if hi == b['y']:
                    b['min'] = lo
                elif lo == b['y'] + b['h']:
                    b['max'] = hi
            break
    return [{'label': b['label'], 'min': b.get('min', b['y']), 'first_quartile': b['y'],
             'median': b.get('median'), 'third_quartile': b['y'] + b['h'],
             'max': b.get('max', b['y'] + b['h']), 'outliers': b['outliers']} for b in boxes]


def figure_chart(fig):
    """The chart of a matplotlib Figure: one Axes' chart, a superchart of
    several, or None for a figure with no data."""
    axes = fig.get_axes()
    if not axes or not any(ax.has_data() for ax in axes):
        return None
    if len(axes) == 1:
        return axes_chart(axes[0])
    title = fig.get_suptitle() if hasattr(fig, 'get_suptitle') else None
    return {'type': 'superchart', 'title': _text(title), 'elements': [axes_chart(ax) for ax in axes]}
