/* A ptxed-style libipt driver for examples/bench_cli.rs: decodes a raw PT trace with libipt's
 * instruction-flow decoder and writes every instruction's address, the way ptxed feeds libipt
 * (image files added through a pt_image_section_cache, sync forward, drain events with
 * pt_insn_event, pt_insn_next per instruction, resync after an error).
 *
 *   ptxed_ips hex|bin TRACE BITS FAMILY/MODEL/STEPPING|- FILE:BASE...
 *
 * hex: "0x<ip>\n" per instruction (the address lines of `ptrewind decode --format ips`);
 * bin: the address as a little-endian u64 per instruction (`--format ips-bin`).
 * stdio gets a 1 MiB buffer so the baseline is not held back by small writes.
 * The number of instructions and errors goes to stderr: "insns N errors E".
 */
#include <intel-pt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char outbuf[1 << 20];

static uint8_t *read_file(const char *path, size_t *size) {
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		exit(1);
	}
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
	if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
		fprintf(stderr, "%s: read failed\n", path);
		exit(1);
	}
	fclose(f);
	*size = (size_t)n;
	return buf;
}

int main(int argc, char **argv) {
	if (argc < 5) {
		fprintf(stderr, "usage: %s hex|bin TRACE BITS CPU|- FILE:BASE...\n", argv[0]);
		return 1;
	}
	int bin = strcmp(argv[1], "bin") == 0;
	size_t size = 0;
	uint8_t *pt = read_file(argv[2], &size);
	(void)argv[3]; /* the mode comes from the trace's MODE.Exec packets, as in ptxed */

	struct pt_config config;
	pt_config_init(&config);
	config.begin = pt;
	config.end = pt + size;
	unsigned fam, model, step;
	if (strcmp(argv[4], "-") != 0 && sscanf(argv[4], "%u/%u/%u", &fam, &model, &step) == 3) {
		config.cpu.vendor = pcv_intel;
		config.cpu.family = (uint16_t)fam;
		config.cpu.model = (uint8_t)model;
		config.cpu.stepping = (uint8_t)step;
		if (pt_cpu_errata(&config.errata, &config.cpu) < 0) {
			fprintf(stderr, "pt_cpu_errata failed\n");
			return 1;
		}
	}
	struct pt_insn_decoder *dec = pt_insn_alloc_decoder(&config);
	if (!dec) {
		fprintf(stderr, "pt_insn_alloc_decoder failed\n");
		return 1;
	}
	struct pt_image *image = pt_insn_get_image(dec);
	struct pt_image_section_cache *isc = pt_iscache_alloc(NULL);
	for (int i = 5; i < argc; i++) {
		char *spec = argv[i];
		char *colon = strrchr(spec, ':');
		if (!colon) {
			fprintf(stderr, "%s: expected FILE:BASE\n", spec);
			return 1;
		}
		*colon = 0;
		uint64_t base = strtoull(colon + 1, NULL, 0);
		FILE *f = fopen(spec, "rb");
		if (!f) {
			perror(spec);
			return 1;
		}
		fseek(f, 0, SEEK_END);
		uint64_t fsize = (uint64_t)ftell(f);
		fclose(f);
		int isid = pt_iscache_add_file(isc, spec, 0, fsize, base);
		if (isid < 0 || pt_image_add_cached(image, isc, isid, NULL) < 0) {
			fprintf(stderr, "%s: cannot add to the image\n", spec);
			return 1;
		}
	}
	setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);

	uint64_t insns = 0, errors = 0;
	uint64_t last_sync = UINT64_MAX;
	for (;;) {
		int status = pt_insn_sync_forward(dec);
		if (status < 0) {
			if (status == -pte_eos)
				break;
			errors++;
			uint64_t off = 0;
			if (pt_insn_get_offset(dec, &off) < 0 || (last_sync != UINT64_MAX && off <= last_sync))
				break;
			last_sync = off;
			continue;
		}
		for (;;) {
			while (status >= 0 && (status & pts_event_pending)) {
				struct pt_event ev;
				status = pt_insn_event(dec, &ev, sizeof(ev));
			}
			if (status < 0)
				break;
			if (status & pts_eos) {
				status = -pte_eos;
				break;
			}
			struct pt_insn insn;
			insn.iclass = ptic_error;
			status = pt_insn_next(dec, &insn, sizeof(insn));
			if (insn.iclass != ptic_error) {
				insns++;
				if (bin)
					fwrite(&insn.ip, 8, 1, stdout);
				else
					printf("0x%" PRIx64 "\n", insn.ip);
			}
			if (status < 0)
				break;
		}
		if (status == -pte_eos)
			break;
		errors++;
	}
	fflush(stdout);
	fprintf(stderr, "insns %" PRIu64 " errors %" PRIu64 "\n", insns, errors);
	pt_insn_free_decoder(dec);
	pt_iscache_free(isc);
	free(pt);
	return 0;
}
