set terminal pngcairo size 960,600 noenhanced
set output 'docs/fidelity/1-approx-error-error-vs-keep.png'
set title 'Error against K'
set xlabel 'keep K'
set ylabel 'kl_mean (nats), max |logit diff|'
set grid
set key outside right
set logscale y 10
set format y '%g'
$kl0 << EOD
70 3.750171276e-08
100 1.901622641e-09
140 5.799708151e-13
200 5.723534154e-15
253 4.59364256e-15
EOD
$max0 << EOD
70 0.01511362195
100 0.004510134459
140 9.918212891e-05
200 3.814697266e-06
253 2.861022949e-06
EOD
$kl1 << EOD
70 3.750300487e-08
100 1.074987706e-08
140 1.074987706e-08
200 1.074987706e-08
253 1.074987706e-08
EOD
$max1 << EOD
70 0.01511366665
100 0.006716489792
140 0.006716489792
200 0.006716489792
253 0.006716489792
EOD
$kl2 << EOD
70 3.750222032e-08
100 1.901679503e-09
140 5.851981408e-13
200 2.422733748e-14
253 2.472532932e-14
EOD
$max2 << EOD
70 0.01511384547
100 0.004510134459
140 9.918212891e-05
200 4.768371582e-06
253 3.814697266e-06
EOD
$kl3 << EOD
70 3.750304938e-08
100 1.074987706e-08
140 1.074987706e-08
200 1.074987706e-08
253 1.074987706e-08
EOD
$max3 << EOD
70 0.01511356235
100 0.006716489792
140 0.006716489792
200 0.006716489792
253 0.006716489792
EOD
plot $kl0 using 1:2 with linespoints pt 7 lc 1 title 'kl_mean mask H=0', \
     $max0 using 1:2 with linespoints pt 5 dt 2 lc 1 title 'max_abs_logit_diff mask H=0', \
     $kl1 using 1:2 with linespoints pt 7 lc 2 title 'kl_mean mask H=304', \
     $max1 using 1:2 with linespoints pt 5 dt 2 lc 2 title 'max_abs_logit_diff mask H=304', \
     $kl2 using 1:2 with linespoints pt 7 lc 3 title 'kl_mean compact H=0', \
     $max2 using 1:2 with linespoints pt 5 dt 2 lc 3 title 'max_abs_logit_diff compact H=0', \
     $kl3 using 1:2 with linespoints pt 7 lc 4 title 'kl_mean compact H=304', \
     $max3 using 1:2 with linespoints pt 5 dt 2 lc 4 title 'max_abs_logit_diff compact H=304'
set output
