"""sphinx-gallery hooks of docs/conf.py: each example writes its PNG files
into a fresh temporary folder (its first argument), and the scraper moves
them into the example's gallery page."""
import os
import shutil
import tempfile

from sphinx_gallery.scrapers import figure_rst

_OUTPUT = {}


def example_argv(gallery_conf, script_vars):
    """``sys.argv[1:]`` of an example: a new temporary output folder."""
    _OUTPUT["dir"] = tempfile.mkdtemp(prefix="onnxtrain_gallery_")
    return [_OUTPUT["dir"]]


def png_scraper(block, block_vars, gallery_conf):
    """The PNG files the block wrote, as the page's images (sorted by name)."""
    folder = _OUTPUT.get("dir")
    if not folder or not os.path.isdir(folder):
        return ""
    images = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".png"):
            target = next(block_vars["image_path_iterator"])
            shutil.move(os.path.join(folder, name), target)
            images.append(target)
    return figure_rst(images, gallery_conf["src_dir"])
